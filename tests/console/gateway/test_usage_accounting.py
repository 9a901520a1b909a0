"""Usage accounting through the gateway against real rows and an engine-like agent on loopback: what the engine's
`usage` said reaches the minute buckets per team, token and deployment, streams included (the usage chunk asked for
and, when the client had not, taken out of its answer); v2 and refusals at a deployment count as requests and
errors without tokens; a stream's reservation is settled when it ends, and when it was never read at all."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.db.models import Sum

from console.accounts.models import ApiToken, Team
from console.fleet.models import AgentCredential
from console.usage.models import UsageMinute
from tests.console.gateway.test_gateway import INFER, _client, _gateway
from tests.console.team_scene import served_scene
from tests.sockets import serve_on_loopback

pytestmark = pytest.mark.django_db(transaction=True)
USAGE = {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}


class EngineAgent:
    """Answers as an engine does: `usage` in JSON answers, and a usage chunk in streams that ask for it."""

    def __init__(self, secret: str) -> None:
        self.secret, self.bodies = secret, []
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/embeddings", self.embed)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v2/models/{name}/infer", self.infer)
        self.runner = web.AppRunner(app)

    async def complete(self, request: web.Request) -> web.Response:
        return web.json_response({"id": "c", "object": "text_completion", "choices": [{"text": "ok"}],
                                  "usage": USAGE})

    async def embed(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"embedding": [0.5] * 8}],
                                  "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    async def infer(self, request: web.Request) -> web.Response:
        return web.json_response({"outputs": []})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in ("a", "b"):
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": word}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            await response.write(f"data: {json.dumps({'choices': [], 'usage': USAGE})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
async def scene(tmp_path):
    credential, _ = await sync_to_async(AgentCredential.issue)("h1")
    agent = EngineAgent(credential.gateway_secret)
    endpoint = await serve_on_loopback(agent.runner)

    yield await sync_to_async(served_scene)(tmp_path, endpoint), agent
    await agent.runner.cleanup()


def _sums(**where) -> dict:
    return UsageMinute.objects.filter(**where).aggregate(
        requests=Sum("requests"), errors=Sum("errors"), prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"))


async def test_engine_usage_reaches_the_buckets_per_team_token_and_deployment(scene):
    teams, agent = scene
    gateway = _gateway()
    async with _client(gateway, teams.tokens["alice"]) as alice, _client(gateway, teams.tokens["bob"]) as bob:
        done = await alice.post("/v1/completions", json={"model": "chat-a", "prompt": "hi"})
        embedded = await alice.post("/v1/embeddings", json={"model": "chat-a", "input": "hi"})
        async with alice.stream("POST", "/v1/chat/completions", json={"model": "chat-a", "stream": True}) as r:
            plain = b"".join([c async for c in r.aiter_bytes()])
        async with alice.stream("POST", "/v1/chat/completions",
                                json={"model": "chat-a", "stream": True,
                                      "stream_options": {"include_usage": True}}) as r:
            asked = b"".join([c async for c in r.aiter_bytes()])
        v2 = await bob.post("/v2/models/chat-b/infer", json=INFER)
    await gateway.flush()
    await gateway.close()
    assert done.json()["usage"] == USAGE and embedded.status_code == v2.status_code == 200
    assert b'"usage"' not in plain and plain.endswith(b"data: [DONE]\n\n")  # as the client asked: no usage chunk
    assert b'"usage"' in asked
    assert all(b["stream_options"]["include_usage"] is True for b in agent.bodies)

    def check():
        alice_token = ApiToken.objects.get(user__username="alice")
        assert _sums(team=teams.a, token=alice_token, deployment="chat-a") == {
            "requests": 4, "errors": 0, "prompt": 6 + 3 + 6 + 6, "completion": 4 + 0 + 4 + 4}
        assert _sums(team=teams.b, deployment="chat-b") == {"requests": 1, "errors": 0, "prompt": 0, "completion": 0}

    await sync_to_async(check)()


async def test_refusals_at_a_deployment_count_as_errors_and_unknown_models_not_at_all(scene):
    teams, _ = scene
    gateway = _gateway(token_concurrency=0)  # every request that reaches chat-a is refused with 429
    async with _client(gateway, teams.tokens["alice"]) as alice:
        limited = await alice.post("/v1/completions", json={"model": "chat-a", "prompt": "hi"})
        unknown = await alice.post("/v1/completions", json={"model": "nobody", "prompt": "hi"})
        theirs = await alice.post("/v1/completions", json={"model": "chat-b", "prompt": "hi"})
    await gateway.flush()
    await gateway.close()
    assert limited.status_code == 429 and unknown.status_code == theirs.status_code == 404
    assert await sync_to_async(_sums)() == {"requests": 1, "errors": 1, "prompt": 0, "completion": 0}


async def test_a_routed_stream_is_counted_against_the_branch_that_served(scene):
    from console.routes.services import create_route

    teams, agent = scene
    await sync_to_async(create_route)("assistant", [{"deployment": "chat-a"}])
    gateway = _gateway()
    async with _client(gateway, teams.tokens["alice"]) as alice:
        async with alice.stream("POST", "/v1/chat/completions", json={"model": "assistant", "stream": True}) as r:
            plain = b"".join([c async for c in r.aiter_bytes()])
            route = r.headers["x-modelgrid-route"]
    await gateway.flush()
    await gateway.close()
    assert route == "assistant -> chat-a" and b'"usage"' not in plain
    assert agent.bodies[-1]["stream_options"] == {"include_usage": True} and agent.bodies[-1]["model"] == "chat-a"
    assert await sync_to_async(_sums)(deployment="chat-a") == {"requests": 1, "errors": 0, "prompt": 6,
                                                               "completion": 4}


async def _stream_left_by_client(gateway, token: str, leaves) -> bytes:
    """A streamed chat straight through the gateway's ASGI app, whose client disconnects at the first message it is
    sent for which `leaves(message)` holds; its request body."""
    import gc

    from console.gateway.app import make_app

    body = json.dumps({"model": "chat-a", "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "server": ("gw", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"authorization", f"Bearer {token}".encode()),
                         (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    messages, gone = [{"type": "http.request", "body": body, "more_body": False}], asyncio.Event()

    async def receive():
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if leaves(message):
            gone.set()
            await asyncio.sleep(5)  # (cancelled at once, as the server sees the disconnect)

    await make_app(gateway)(scope, receive, send)
    gc.collect()
    return body


async def test_a_streams_reservation_is_settled_when_it_ends_and_when_it_never_began(scene):
    teams, _ = scene
    await sync_to_async(Team.objects.filter(pk=teams.a.pk).update)(tpm_limit=10**6)
    gateway = _gateway()
    async with _client(gateway, teams.tokens["alice"]) as alice:
        async with alice.stream("POST", "/v1/chat/completions", json={"model": "chat-a", "stream": True}) as r:
            assert b"".join([c async for c in r.aiter_bytes()]).endswith(b"data: [DONE]\n\n")
    assert not gateway.limiter.held  # settled: the engine's 10 tokens count
    # The client goes as the answer's headers go out: its stream is never read.
    body = await _stream_left_by_client(gateway, teams.tokens["alice"],
                                        lambda message: message["type"] == "http.response.start")
    assert not gateway.limiter.held  # a stream never iterated still settles
    assert not gateway.outstanding  # ... and its replica's count of requests in flight drops
    await gateway.flush()
    await gateway.close()
    # Its client left (499) once it was sent: charged its prompt as reserved (its body's bytes), and no event.
    assert await sync_to_async(_sums)(deployment="chat-a") == {"requests": 2, "errors": 1, "prompt": 6 + len(body),
                                                               "completion": 4}


async def test_a_client_that_hangs_up_once_it_has_read_done_is_no_error_and_pays_what_the_engine_counted(scene):
    teams, _ = scene
    await sync_to_async(Team.objects.filter(pk=teams.a.pk).update)(tpm_limit=10**6)
    gateway = _gateway()
    # The client closes as soon as it has [DONE], before the server's end of the body.
    await _stream_left_by_client(gateway, teams.tokens["alice"], lambda message: (
        message["type"] == "http.response.body" and b"data: [DONE]" in message.get("body", b"")))
    assert not gateway.limiter.held
    await gateway.flush()
    await gateway.close()
    assert await sync_to_async(_sums)(deployment="chat-a") == {"requests": 1, "errors": 0, "prompt": 6,
                                                               "completion": 4}


async def test_a_flush_cancelled_while_its_write_waits_for_a_thread_still_writes_what_it_took(scene, monkeypatch):
    from console.gateway import core

    teams, _ = scene
    queued, free = asyncio.Event(), asyncio.Event()
    real = core.own_thread

    def own_thread(fn):  # the usage write waits for a free database thread first: cancelled then, it never runs
        if fn is not core.usage_store.write:
            return real(fn)

        async def call(*args):
            queued.set()
            await free.wait()
            return await sync_to_async(fn)(*args)
        return call

    gateway = _gateway()  # not started: no flusher of its own runs
    token = await sync_to_async(lambda: ApiToken.objects.get(user__username="alice").pk)()
    gateway.usage.add("chat-a", teams.a.pk, token, 200, 0.0, 6, 4)  # a request's tally
    monkeypatch.setattr(core, "own_thread", own_thread)
    flushing = asyncio.ensure_future(gateway.flush())  # as the gateway's flusher, when the gateway closes
    await queued.wait()
    flushing.cancel()
    await asyncio.sleep(0)
    free.set()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    monkeypatch.setattr(core, "own_thread", real)
    await gateway.close()
    assert await sync_to_async(_sums)(deployment="chat-a") == {"requests": 1, "errors": 0, "prompt": 6,
                                                               "completion": 4}
