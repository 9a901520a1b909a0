"""bench/standard/driver.py against a fake OpenAI-style server (aiohttp, loopback): time to the first text, tokens
from the usage event, errors as records, and the split's draw by weight."""

import asyncio
import json

import pytest
from aiohttp import web

from bench.standard import driver


def sse(*events) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.fixture
async def fake():
    """A /v1/completions that streams 'a', 'b' after a 50 ms pause, then its usage; model 'broken' answers 404, and
    'midway' ends its stream with an error event. It keeps every body it got."""
    bodies = []

    async def completions(request):
        body = await request.json()
        bodies.append(body | {"auth": request.headers.get("Authorization")})
        if body["model"] == "broken":
            return web.json_response({"error": {"message": "no model 'broken'"}}, status=404)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(0.05)
        if body["model"] == "midway":
            await response.write(sse({"choices": [{"text": "a"}]}, {"error": {"message": "worker died"}}))
            return response
        await response.write(sse({"choices": [{"text": ""}]}))  # a role-only first event is no token yet
        await response.write(sse({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]},
                                 {"choices": [], "usage": {"completion_tokens": 2}}))
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", bodies
    await runner.cleanup()


async def test_a_request_is_timed_to_its_first_text_and_counted_by_usage(fake):
    url, bodies = fake
    record = await driver.cold_request(url, "k", "m", "hello", 2)
    assert record.error == "" and record.tokens == 2
    assert 0.05 <= record.ttft_s <= record.total_s
    assert bodies[0]["ignore_eos"] and bodies[0]["max_tokens"] == 2 and bodies[0]["stream"]
    assert bodies[0]["auth"] == "Bearer k"


async def test_a_refusal_and_a_broken_stream_are_errors_with_their_reasons(fake):
    url, _ = fake
    refused = await driver.cold_request(url, "k", "broken", "hello", 2)
    assert refused.error.startswith("404") and "no model 'broken'" in refused.error
    broken = await driver.cold_request(url, "k", "midway", "hello", 2)
    assert "worker died" in broken.error


async def test_the_split_draws_models_by_weight_for_its_duration(fake):
    url, bodies = fake
    records, wall = await driver.split_load(url, "k", [("a1", 3), ("a2", 1)], ["p1", "p2"], 2, streams=4,
                                            seconds=0.6)
    assert wall >= 0.6 and len(records) == len(bodies) >= 8
    assert all(not r.error and r.tokens == 2 for r in records)
    drawn = [b["model"] for b in bodies]
    assert set(drawn) == {"a1", "a2"} and drawn.count("a1") > drawn.count("a2")
    assert {b["prompt"] for b in bodies} == {"p1", "p2"}
