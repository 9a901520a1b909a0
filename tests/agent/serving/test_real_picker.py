"""The endpoint picker's page over a real worker (the demo tiny-llama): its running requests and KV usage rise while
generations run and fall back when they end, as a picker scraping it would read them."""

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.workers.demo_models import build_tiny_llama
from tests.agent.serving.real_worker import real_agent

SECRET = "gw-secret-for-real-picker-tests"
STREAMS = 3


async def scrape(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as session:
        async with session.get(f"http://127.0.0.1:{port}/msp/chat/metrics") as response:
            assert response.status == 200, await response.text()
            text = await response.text()
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text)}


async def scrape_until(port: int, predicate, what: str, timeout: float = 60.0) -> dict[str, float]:
    async with asyncio.timeout(timeout):
        while not predicate(seen := await scrape(port)):
            await asyncio.sleep(0.02)
    assert predicate(seen), what
    return seen


@pytest.mark.asyncio
async def test_running_requests_and_kv_usage_follow_a_real_workers_load(tmp_path):
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    async with real_agent(llama, "chat", SECRET) as client:
        idle = await scrape(client.port)
        assert idle["vllm:num_requests_running"] == 0 and idle["vllm:num_requests_waiting"] == 0
        assert idle["vllm:kv_cache_usage_perc"] == 0
        assert client.handle.info["kv_capacity_bytes"] > 0  # the worker sized the KV share of its reservation

        streams = [await client.completions.create(model="chat", prompt=f"Story number {i}:", max_tokens=200,
                                                   temperature=0, stream=True) for i in range(STREAMS)]
        readers = [asyncio.ensure_future(_drain(s)) for s in streams]
        busy = await scrape_until(client.port, lambda m: m["vllm:num_requests_running"] == STREAMS,
                                  "every stream running")
        assert 0 < busy["vllm:kv_cache_usage_perc"] <= 1
        grown = await scrape_until(client.port, lambda m: m["vllm:kv_cache_usage_perc"] >
                                   busy["vllm:kv_cache_usage_perc"], "the KV cache growing as tokens are generated")
        assert grown["vllm:num_requests_running"] <= STREAMS

        await asyncio.gather(*readers)
        done = await scrape_until(client.port, lambda m: m["vllm:num_requests_running"] == 0, "the batch emptied")
        assert done["vllm:kv_cache_usage_perc"] == 0 and done["vllm:num_requests_waiting"] == 0


async def _drain(stream) -> str:
    return "".join([chunk.choices[0].text async for chunk in stream])
