"""Generation through the agent's HTTP server over a real worker (the demo tiny-llama), driven by the official
openai client: streams equal the plain answers, a client that leaves frees its slot at once, and a v2 forward
is not held behind a long generation."""

import asyncio
import time

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from agent.workers.demo_models import build_tiny_llama
from agent.workers.messages import Reply, Tokens
from tests.agent.serving.real_worker import real_agent
from tests.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = "gw-secret-for-real-generation-tests"
PROMPTS = ["Once upon a time", "The capital of France", "def fibonacci(n):", "In the beginning"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def agent(tmp_path_factory):
    llama = build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    async with real_agent(llama, "chat", SECRET) as c:  # c.port, c.handle: the server's port, the worker's handle
        yield c


async def streamed_completion(client, prompt, **kwargs):
    stream = await client.completions.create(model="chat", prompt=prompt, stream=True, **kwargs)
    return "".join([chunk.choices[0].text async for chunk in stream])


async def streamed_chat(client, content, **kwargs):
    stream = await client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": content}], stream=True, **kwargs)
    return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])


async def test_streamed_completions_and_chats_equal_the_plain_greedy_answers_under_concurrency(agent):
    greedy = dict(max_tokens=24, temperature=0)
    plain = await asyncio.gather(*(agent.completions.create(model="chat", prompt=p, **greedy) for p in PROMPTS))
    chats = await asyncio.gather(*(agent.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": p}], **greedy) for p in PROMPTS))
    # All at once: streams and plain requests share the running batch.
    streamed = await asyncio.gather(*(streamed_completion(agent, p, **greedy) for p in PROMPTS),
                                    *(streamed_chat(agent, p, **greedy) for p in PROMPTS),
                                    *(agent.completions.create(model="chat", prompt=p, **greedy) for p in PROMPTS))
    texts = [c.choices[0].text for c in plain]
    assert streamed[:4] == texts
    assert streamed[4:8] == [c.choices[0].message.content for c in chats]
    assert [c.choices[0].text for c in streamed[8:]] == texts
    assert all(c.usage.completion_tokens == 24 for c in plain)
    assert len(set(texts)) == len(texts) and all(texts)


async def test_seeded_sampling_streams_the_same_text_as_it_answers(agent):
    sampled = dict(max_tokens=16, temperature=0.8, top_p=0.9, seed=11)
    plain = await agent.completions.create(model="chat", prompt=PROMPTS[0], **sampled)
    assert await streamed_completion(agent, PROMPTS[0], **sampled) == plain.choices[0].text


async def test_a_stream_whose_client_leaves_frees_its_slot_and_the_next_request_is_prompt(agent):
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        body = {"model": "chat", "prompt": PROMPTS[0], "max_tokens": 230, "stream": True}
        async with http.post(f"http://127.0.0.1:{agent.port}/v1/completions", json=body) as response:
            assert (await response.content.readline()).startswith(b"data: ")
    # The sequence leaves the batch at the worker's next step, long before its 230 tokens.
    await until(lambda: agent.handle.queued == 0 and agent.handle.engine_stats.running == 0, 1.0,
                "the cancelled sequence to leave the batch")
    started = time.monotonic()
    short = await agent.completions.create(model="chat", prompt=PROMPTS[1], max_tokens=2)
    assert short.choices[0].finish_reason == "length"
    assert time.monotonic() - started < 1.0


async def test_a_v2_forward_is_answered_while_a_long_generation_runs(agent, monkeypatch):
    # Judged by the order of the worker's own messages on its pipe, not by which HTTP answer the client sees
    # first: encoding and decoding the 16,384 logits as JSON can outlast the generation's remaining steps on a
    # busy machine (CI once saw the generation finish first although the worker had answered between steps).
    link = agent.handle.link
    decoded, decoded_when_answered = [], []
    handle = link._handle

    def recording(message):
        if isinstance(message, Tokens):
            decoded.append(len(message.tokens))
        elif isinstance(message, Reply) and message.request_id not in link._streams:
            decoded_when_answered.append(sum(decoded))
        handle(message)

    monkeypatch.setattr(link, "_handle", recording)
    # Several long generations at once: their steps are slower than one's, so the forward surely arrives while they
    # run however slow the machine is at getting it there (one alone once finished its 230 tokens first in CI).
    streams = 8
    long = [asyncio.ensure_future(agent.completions.create(model="chat", prompt=PROMPTS[2], max_tokens=230,
                                                           temperature=0)) for _ in range(streams)]
    await until(lambda: agent.handle.engine_stats.running == streams, 5.0, "the generations to start")
    tensor = {"name": "input_ids", "shape": [2, 8], "datatype": "INT64", "data": list(range(1, 17))}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        async with http.post(f"http://127.0.0.1:{agent.port}/v2/models/chat/infer", json={"inputs": [tensor]}) as r:
            answer = await r.json()
    assert r.status == 200 and answer["outputs"][0]["shape"] == [2, 8, 1024]
    assert [(await g).usage.completion_tokens for g in long] == [230] * streams
    # Answered between two decoding steps: the worker sent the forward's reply before the generations' last tokens.
    assert len(decoded_when_answered) == 1 and decoded_when_answered[0] < 230 * streams, decoded_when_answered
    assert sum(decoded) == 230 * streams
    logits = np.asarray(answer["outputs"][0]["data"], dtype=np.float32)
    assert np.isfinite(logits).all()
