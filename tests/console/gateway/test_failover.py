"""The gateway when a replica's agent stops answering: a bound on the wait for an answer (504 naming the replica and
its host's state), a request waiting on a host whose lease lapses sent once to another replica, and a stream that
breaks off or goes silent ended with an error event. Real rows and fake agents on loopback, as in test_gateway.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.test import override_settings
from django.utils import timezone

from console.catalog.services import register_model
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.fleet.models import Host
from console.gateway.core import GatewaySettings
from console.usage.models import UsageMinute
from tests.console.gateway.test_gateway import INFER, FakeAgent, _client, _gateway, _host, _ready_replica, _token

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}


class FaultyAgent(FakeAgent):
    """A fake agent whose streams can fail after their first event: `stall` (nothing more comes, as from a paused
    agent), `cut` (the connection closes, as when a process dies) or `told` (an error event ends it, as an agent ends
    the stream of a vLLM that died)."""

    def __init__(self, secret: str, name: str) -> None:
        super().__init__(secret, name)
        self.fault = ""

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if self.fault != "cut":
            return await super().answer(request)
        self.seen.append((request.path, await request.read()))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 100
        await response.prepare(request)
        await response.write(b'{"agent": ')
        await asyncio.sleep(0.05)
        request.transport.close()
        return response

    async def stream(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, await request.read()))
        if not self.fault:
            return await super().stream(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n')
        if self.fault == "told":
            error = {"error": {"message": "its vLLM server broke off the stream", "type": "server_error"}}
            await response.write(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode())
            return response
        if self.fault == "cut":
            await asyncio.sleep(0.05)
            request.transport.close()
            return response
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return response


@pytest.fixture
async def fleet(model_dir):
    """Deployment `chat` with a ready replica on h1 and one on h2, each host with its fake agent; a token."""
    agents, hosts = [], []
    for name in ("h1", "h2"):
        agent = FaultyAgent("", name)
        host, agent.secret = await sync_to_async(_host)(name, await agent.start())
        agents.append(agent)
        hosts.append(host)

    def rows():
        register_model("tiny", str(model_dir))
        dep = create_deployment("chat", "tiny", min_replicas=1, max_replicas=2)
        return [_ready_replica(dep, i, host).pk for i, host in enumerate(hosts)], _token()

    replicas, token = await sync_to_async(rows)()
    yield agents, replicas, token
    for agent in agents:
        await agent.runner.cleanup()


async def _until(predicate, what: str) -> None:
    for _ in range(250):  # up to 5 s
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never saw {what}")


async def _lapse(name: str) -> None:
    """The host's lease lapses: the scheduler's tick marks it unknown (console/control/reconcile.py)."""
    await sync_to_async(Host.objects.filter(name=name).update)(connected=False, unknown_since=timezone.now())


async def test_a_replica_that_does_not_answer_in_time_gets_504_naming_it_and_its_hosts_state(fleet):
    agents, _, token = fleet
    for agent in agents:
        agent.delay = 30  # paused: nothing comes back
    gateway = _gateway(response_timeout_s=0.5)
    async with _client(gateway, token) as client:
        r = await client.post("/v2/models/chat/infer", json=INFER)
    await _until(lambda: sum(a.cancelled for a in agents) == 1, "the agent's request cancelled")
    await gateway.close()
    assert r.status_code == 504, r.text
    (agent,) = [a for a in agents if a.seen]  # not sent again: the replica may have been running it
    label = {"h1": "chat#0", "h2": "chat#1"}[agent.name]
    assert r.json()["error"] == (f"replica {label} on host {agent.name} did not answer within 0.5 s "
                                 f"(host {agent.name} is connected)")


async def test_a_request_waiting_on_a_host_whose_lease_lapses_is_sent_once_to_another_replica(fleet):
    agents, replicas, token = fleet
    agents[0].delay = 30  # h1's agent is paused
    gateway = _gateway()
    await gateway.ensure_started()
    gateway.outstanding[replicas[1]] = 1  # busier: the request goes to h1 first
    async with _client(gateway, token) as client:
        call = asyncio.ensure_future(client.post("/v1/completions", json={"model": "chat", "prompt": "hi"}))
        await _until(lambda: agents[0].seen or call.done(), "the request reach h1")
        await _lapse("h1")
        await gateway.refresh()
        answer = await asyncio.wait_for(call, 10)
        gateway.outstanding.pop(replicas[1])
        after = [await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"}) for _ in range(3)]
    await _until(lambda: agents[0].cancelled == 1, "the paused agent's request dropped")
    await gateway.close()
    assert answer.status_code == 200, answer.text
    assert answer.json()["agent"] == "h2" and answer.headers["x-modelgrid-replica"] == "chat#1"
    # The host is unknown: nothing more is sent to it.
    assert [r.json()["agent"] for r in after] == ["h2"] * 3 and len(agents[0].seen) == 1


async def test_a_request_waiting_on_a_host_whose_link_closes_under_a_live_agent_is_answered_there(fleet):
    # A console restarting closes its agents' links: they are unknown until they reconnect, but they were heard just
    # now and serve on; what they run is not sent again elsewhere.
    agents, replicas, token = fleet
    agents[0].delay = 0.5
    gateway = _gateway()
    await gateway.ensure_started()
    gateway.outstanding[replicas[1]] = 1  # busier: the request goes to h1
    async with _client(gateway, token) as client:
        call = asyncio.ensure_future(client.post("/v1/completions", json={"model": "chat", "prompt": "hi"}))
        await _until(lambda: agents[0].seen or call.done(), "the request reach h1")
        now = timezone.now()
        await sync_to_async(Host.objects.filter(name="h1").update)(connected=False, unknown_since=now, last_seen=now)
        await gateway.refresh()
        answer = await asyncio.wait_for(call, 10)
    await gateway.close()
    assert answer.status_code == 200 and answer.json()["agent"] == "h1"
    assert not agents[1].seen and agents[0].cancelled == 0


async def test_a_request_on_a_lapsed_host_with_no_other_replica_gets_504_saying_so(fleet):
    agents, _, token = fleet
    await sync_to_async(Replica.objects.filter(host__name="h2").delete)()
    agents[0].delay = 30
    gateway = _gateway()
    async with _client(gateway, token) as client:
        call = asyncio.ensure_future(client.post("/v1/completions", json={"model": "chat", "prompt": "hi"}))
        await _until(lambda: agents[0].seen or call.done(), "the request reach h1")
        await _lapse("h1")
        await gateway.refresh()
        answer = await asyncio.wait_for(call, 10)
    await gateway.close()
    assert answer.status_code == 504, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("replica chat#0 on host h1 did not answer within ")
    assert message.endswith(" s (host h1 is unknown: its lease lapsed or its link closed), and no other replica of "
                            "model 'chat' is ready")
    assert answer.json()["error"]["code"] == "upstream_timeout"


@pytest.mark.parametrize("fault", ["stall", "cut"])
async def test_a_stream_that_stops_ends_with_an_error_event(fleet, fault):
    agents, _, token = fleet
    for agent in agents:
        agent.fault = fault
    gateway = _gateway(stream_idle_s=0.5)
    async with _client(gateway, token) as client:
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            events = [line async for line in r.aiter_lines() if line.startswith("data:")]
    await gateway.close()
    assert r.status_code == 200
    assert len(events) == 3 and events[-1] == "data: [DONE]", events  # one piece, the error, the end
    error = json.loads(events[1].removeprefix("data:"))["error"]
    assert error["type"] == "server_error" and error["code"] == "upstream_broken"
    why = "sent nothing for 0.5 s" if fault == "stall" else "broke off its answer"
    host = next(a.name for a in agents if a.seen)
    assert error["message"].startswith(f"replica {r.headers['x-modelgrid-replica']} on host {host} {why}"), error


@pytest.mark.parametrize("fault", ["stall", "cut", "told"])
async def test_a_stream_that_breaks_off_after_it_began_counts_as_an_error_not_a_200(fleet, fault):
    agents, _, token = fleet
    for agent in agents:
        agent.fault = fault
    gateway = _gateway(stream_idle_s=0.5)
    async with _client(gateway, token) as client:
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            _ = [line async for line in r.aiter_lines()]
    await gateway.flush()
    await gateway.close()
    assert r.status_code == 200  # its headers were sent before it broke: the client reads the error event
    requests = {s.labels["code"]: s.value for s in gateway.metrics.requests.collect()[0].samples
                if s.name.endswith("_total")}
    assert requests == {"502": 1}
    errors = await sync_to_async(lambda: list(UsageMinute.objects.values_list("requests", "errors")))()
    assert errors == [(1, 1)]


async def test_an_answer_cut_off_after_its_headers_gets_502_and_is_not_sent_again(fleet):
    agents, _, token = fleet
    for agent in agents:
        agent.fault = "cut"
    gateway = _gateway()
    async with _client(gateway, token) as client:
        r = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    await gateway.close()
    assert r.status_code == 502, r.text
    (agent,) = [a for a in agents if a.seen]  # the replica may have run it
    label = {"h1": "chat#0", "h2": "chat#1"}[agent.name]
    error = r.json()["error"]
    assert error["code"] == "upstream_broken"
    assert error["message"].startswith(f"replica {label} on host {agent.name} broke off its answer")


def test_the_gateways_timeouts_come_from_the_settings():
    with override_settings(MODELGRID_GATEWAY_CONNECT_TIMEOUT_SECONDS=2.0,
                           MODELGRID_GATEWAY_RESPONSE_TIMEOUT_SECONDS=9.0, MODELGRID_GATEWAY_STREAM_IDLE_SECONDS=7.0):
        settings = GatewaySettings.from_django()
    assert (settings.connect_timeout_s, settings.response_timeout_s, settings.stream_idle_s) == (2.0, 9.0, 7.0)


async def test_a_stream_holds_its_concurrency_slot_until_it_ends_not_only_until_its_headers(fleet):
    from console.gateway.app import make_app

    agents, _, token = fleet
    for agent in agents:
        agent.fault = "stall"  # one event, then nothing until its client goes
    gateway = _gateway(token_concurrency=1)
    body = json.dumps(CHAT).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "server": ("gw", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    messages, begun, gone = [{"type": "http.request", "body": body, "more_body": False}], asyncio.Event(), \
        asyncio.Event()

    async def receive():
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):  # a server writing to a client that reads as it comes
        if message["type"] == "http.response.body" and b"data:" in message.get("body", b""):
            begun.set()

    streaming = asyncio.create_task(make_app(gateway)(scope, receive, send))
    async with _client(gateway, token) as client:
        await asyncio.wait_for(begun.wait(), 5)
        during = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
        gone.set()  # the stream's client goes
        await asyncio.wait_for(streaming, 5)
        after = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    await gateway.close()
    assert (during.status_code, after.status_code) == (429, 200), during.text
    assert "this token already has 1 requests in flight" in during.json()["error"]["message"]
    assert not any(gateway.per_token.values()) and not any(gateway.per_deployment.values())
