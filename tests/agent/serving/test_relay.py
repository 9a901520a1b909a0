"""The agent's relay to a vLLM server (agent/serving/relay.py) when that server dies or goes silent mid-stream: the
client's stream ends at once with an OpenAI error event and `[DONE]`, as vLLM ends a stream that fails, and never
with half an event. A stand-in server in this process plays vLLM."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agent.serving import make_app
from agent.serving.auth import GatewayAuth
from agent.workers.spec import WorkerSpec
from tests.agent.serving.fake_app import AUTH, SECRET, FakeSource
from tests.sockets import serve_on_loopback

FIRST = b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'


class VllmReplica:
    """A ready replica whose vLLM server listens on `port` (what the relay reads of a worker's handle)."""

    def __init__(self, port: int) -> None:
        self.spec = WorkerSpec(7, "/models/chat", "causal-lm", deployment="chat", engine="vllm")
        self.state, self.reason, self.adapters, self.queued = "ready", "", set(), 0
        self.info = {"port": port, "key": "vllm-key"}
        self.picked, self.last_used = 0, 0.0


class DyingVllm:
    """Streams one event and half of the next, then dies (`stall`: goes silent, its connection open)."""

    def __init__(self, stall: bool = False) -> None:
        self.stall = stall
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app, handler_cancellation=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(FIRST)
        await response.write(b'data: {"choices": [{"ind')  # the process dies in the middle of an event
        await asyncio.sleep(0.05)
        if self.stall:
            await asyncio.sleep(30)
        request.transport.close()
        return response


@pytest.fixture
async def relayed():
    """A client of the agent's app over one vLLM replica served by a DyingVllm, and that replica."""
    started = []

    async def start(vllm: DyingVllm, generation_timeout: float | None = None):
        endpoint = await serve_on_loopback(vllm.runner)
        replica = VllmReplica(int(endpoint.rsplit(":", 1)[1]))
        app = make_app(FakeSource(replica), auth=GatewayAuth(SECRET), generation_timeout=generation_timeout)
        client = TestClient(TestServer(app), headers=AUTH)
        await client.start_server()
        started.append((client, vllm))
        return client, replica

    yield start
    for client, vllm in started:
        await client.close()
        await vllm.runner.cleanup()


async def _events(client: TestClient) -> list[bytes]:
    async with client.post("/v1/completions", json={"model": "chat", "prompt": "hi", "stream": True}) as response:
        assert response.status == 200
        body = await asyncio.wait_for(response.content.read(), 10)
    return [event for event in body.split(b"\n\n") if event]


@pytest.mark.parametrize("stall", [False, True], ids=["killed", "silent"])
async def test_a_stream_whose_vllm_dies_midway_ends_with_an_error_event_and_done(relayed, stall):
    client, replica = await relayed(DyingVllm(stall), generation_timeout=0.5 if stall else None)
    events = await _events(client)
    assert events[0] + b"\n\n" == FIRST and events[-1] == b"data: [DONE]" and len(events) == 3, events
    error = json.loads(events[1].removeprefix(b"data: "))["error"]  # half an event is never passed on
    why = "sent nothing for 0.5 s" if stall else "broke off the stream"
    assert error["message"].startswith(f"replica 7 of 'chat': its vLLM server {why}"), error
    assert error["type"] == "server_error" and error["code"] == "inference_failed"
    assert replica.picked == 0  # nothing left counted against a drain
