"""The gateway against real database rows and real agents on loopback (small aiohttp servers that check
the host's gateway secret and answer like an agent): auth, routing, limits, retries, demand queues."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from agent.protocol import REPLICA_HEADER, UNSERVED_HEADER
from console.accounts.models import ApiToken, Scope
from console.catalog.services import register_model
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.fleet.models import AgentCredential, Host
from console.gateway.app import make_app
from console.gateway.core import Gateway, GatewaySettings
from console.gateway.metrics import ConsoleMetrics
from tests.sockets import serve_on_loopback

pytestmark = pytest.mark.django_db(transaction=True)


class FakeAgent:
    """An agent's inference port: answers infer/completions with which replica it is, after checking the
    secret; `delay` holds answers back; `seen` records every request."""

    def __init__(self, secret: str, name: str) -> None:
        self.secret, self.name, self.delay, self.seen, self.cancelled = secret, name, 0.0, [], 0
        self.picked: list[str | None] = []  # the replica id each request named
        self.draining = False  # answers as an agent whose replica of the model is leaving: 503, nothing run
        app = web.Application()
        app.router.add_post("/v2/models/{name}/infer", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        for path in ("/v1/responses", "/tokenize", "/detokenize"):  # vLLM's, relayed by its agent
            app.router.add_post(path, self.answer)
        app.router.add_post("/v1/chat/completions", self.stream)
        self.runner = web.AppRunner(app, handler_cancellation=True)  # sees the gateway hang up

    async def start(self) -> str:
        return await serve_on_loopback(self.runner)

    async def answer(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.secret}":
            return web.json_response({"error": "bad secret"}, status=401)
        body = await request.read()
        self.seen.append((request.path, body))
        self.picked.append(request.headers.get(REPLICA_HEADER))
        if self.draining:
            return web.json_response({"error": "model 'chat' is not ready: replica 1 of 'chat' is draining"},
                                     status=503, headers={UNSERVED_HEADER: "1"})
        if b'"big"' in body:
            return await self.big(request)
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return web.json_response({"agent": self.name, "path": request.path})

    async def big(self, request: web.Request) -> web.StreamResponse:
        """A long v2 answer written piece by piece, as the agent streams large tensors (no Content-Length)."""
        response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
        await response.prepare(request)
        await response.write(b'{"outputs": [{"data": [')
        for _ in range(50):
            await response.write(b"0.5, " * 1000)
        await response.write(b'1.0]}]}')
        return response

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f"data: {{\"n\": {i}}}\n\n".encode())
            await asyncio.sleep(0.01)
        await response.write(b"data: [DONE]\n\n")
        return response


def _token(scope=Scope.ALL) -> str:
    user, _ = get_user_model().objects.get_or_create(username="client")
    return ApiToken.issue(user, scope=scope)[1]


def _host(name: str, endpoint: str) -> tuple[Host, str]:
    credential, _ = AgentCredential.issue(name)
    host = Host.objects.create(name=name, endpoint=endpoint, connected=True)
    return host, credential.gateway_secret


def _ready_replica(dep: Deployment, index: int, host: Host) -> Replica:
    return Replica.objects.create(deployment=dep, index=index, host=host, desired_state="ready",
                                  observed_state="ready")


@pytest.fixture
async def fleet(model_dir):
    """Two hosts, each with a fake agent, and deployment `chat` with one ready replica on each."""
    agents, hosts = [], []
    for name in ("h1", "h2"):
        credential, _ = await sync_to_async(AgentCredential.issue)(name)
        agent = FakeAgent(credential.gateway_secret, name)
        endpoint = await agent.start()
        host = await sync_to_async(Host.objects.create)(name=name, endpoint=endpoint, connected=True)
        agents.append(agent)
        hosts.append(host)

    def rows():
        register_model("tiny", str(model_dir))
        dep = create_deployment("chat", "tiny", min_replicas=1, max_replicas=2)
        for i, host in enumerate(hosts):
            _ready_replica(dep, i, host)
        return _token()

    token = await sync_to_async(rows)()
    yield agents, hosts, token
    for agent in agents:
        await agent.runner.cleanup()


def _client(gateway: Gateway, token: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(make_app(gateway)), base_url="http://gw",
                             headers=headers, timeout=10)


def _gateway(**overrides) -> Gateway:
    return Gateway(replace(GatewaySettings(), **overrides), ConsoleMetrics())


INFER = {"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]}


async def test_it_sends_a_request_to_a_ready_replica_with_its_hosts_secret(fleet):
    agents, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        r = await client.post("/v2/models/chat/infer", json=INFER)
    await gateway.close()
    assert r.status_code == 200, r.text
    assert r.json()["agent"] in ("h1", "h2")
    assert r.headers["x-modelgrid-replica"] in ("chat#0", "chat#1")
    assert float(r.headers["x-modelgrid-queue-ms"]) == 0.0
    assert sum(len(a.seen) for a in agents) == 1
    assert json.loads(next(a for a in agents if a.seen).seen[0][1]) == INFER  # the body, unchanged


async def test_it_refuses_a_request_without_a_valid_token(fleet):
    agents, _, _ = fleet
    gateway = _gateway()
    async with _client(gateway, "mg_api_not-a-token") as client:
        bad = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    async with _client(gateway) as client:
        missing = await client.post("/v2/models/chat/infer", json=INFER)
        listing = await client.get("/v1/models")
    await gateway.close()
    assert bad.status_code == missing.status_code == listing.status_code == 401
    assert bad.json()["error"]["type"] == "authentication_error"
    assert "Bearer" in missing.json()["error"]
    assert not any(a.seen for a in agents)


async def test_an_inference_only_token_may_infer(fleet):
    token = await sync_to_async(_token)(Scope.INFERENCE)
    gateway = _gateway()
    async with _client(gateway, token) as client:
        r = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    await gateway.close()
    assert r.status_code == 200


async def test_requests_spread_over_ready_replicas_by_outstanding_requests(fleet):
    agents, _, token = fleet
    for agent in agents:
        agent.delay = 0.2
    gateway = _gateway()
    async with _client(gateway, token) as client:
        answers = await asyncio.gather(*(client.post("/v2/models/chat/infer", json=INFER) for _ in range(8)))
    await gateway.close()
    assert all(r.status_code == 200 for r in answers)
    assert [len(a.seen) for a in agents] == [4, 4]


async def test_one_adapters_requests_stick_to_one_replica_until_it_is_loaded_beyond_the_bound(fleet):
    agents, _, token = fleet
    gateway = _gateway()
    await gateway.ensure_started()
    dep = gateway.fleet.deployments["chat"]
    first = gateway.pick(dep, "support-bot").replica
    assert all(gateway.pick(dep, "support-bot").replica == first for _ in range(20))  # idle: always the same one
    gateway.outstanding[first.id] = 5  # hot on it: 1.25x the mean is exceeded, so it spills over
    assert gateway.pick(dep, "support-bot").replica != first
    await gateway.close()


async def test_a_replica_that_cannot_be_reached_is_retried_once_elsewhere_then_avoided(fleet):
    agents, hosts, token = fleet
    await agents[0].runner.cleanup()  # h1's agent is gone; the database still says its replica is ready
    gateway = _gateway()
    async with _client(gateway, token) as client:
        answers = [await client.post("/v2/models/chat/infer", json=INFER) for _ in range(4)]
    await gateway.close()
    assert [r.status_code for r in answers] == [200] * 4
    assert {r.json()["agent"] for r in answers} == {"h2"}
    assert gateway.suspects  # the unreachable replica is avoided without another connection attempt


async def test_a_replica_whose_agent_refuses_it_untouched_is_retried_once_elsewhere(fleet):
    # A scale-down under load: the gateway's view still lists the leaving replica; its agent drains it and
    # refuses new requests before running them, so the other replica takes them and no client sees a 503.
    agents, hosts, token = fleet
    agents[0].draining = True
    gateway = _gateway(queue_wait_s=0.5)
    async with _client(gateway, token) as client:
        answers = [await client.post("/v2/models/chat/infer", json=INFER) for _ in range(6)]
        # No replica left to take it: it waits in the queue for one, and past the wait gets the agent's own
        # answer, reason and all.
        agents[1].draining = True
        refused = await client.post("/v2/models/chat/infer", json=INFER)
    await gateway.close()
    assert [r.status_code for r in answers] == [200] * 6 and {r.json()["agent"] for r in answers} == {"h2"}
    assert refused.status_code == 503 and "draining" in refused.json()["error"]


async def test_a_request_that_finds_its_only_replica_asleep_waits_for_it_to_wake(fleet):
    # The gateway's picture lags: it sends to a replica its agent has just put to sleep. The request waits in the
    # deployment's queue while the scheduler wakes it, as for a model that was not ready, instead of a 503.
    agents, hosts, token = fleet
    await sync_to_async(Replica.objects.filter(host=hosts[1]).delete)()
    agents[0].draining = True
    gateway = _gateway()
    async with _client(gateway, token) as client:
        request = asyncio.ensure_future(client.post("/v2/models/chat/infer", json=INFER))
        for _ in range(200):
            if agents[0].seen or request.done():
                break
            await asyncio.sleep(0.02)
        rows = Replica.objects.filter(host=hosts[0])
        await sync_to_async(rows.update)(observed_state="sleeping")
        await gateway.refresh()
        agents[0].draining = False
        await sync_to_async(rows.update)(observed_state="ready")  # woken
        await gateway.refresh()
        answer = await asyncio.wait_for(request, 10)
    await gateway.close()
    assert answer.status_code == 200, answer.text
    assert len(agents[0].seen) == 2 and float(answer.headers["x-modelgrid-queue-ms"]) > 0


async def test_a_client_that_goes_away_cancels_the_upstream_request(fleet):
    agents, _, token = fleet
    for agent in agents:
        agent.delay = 5
    gateway = _gateway()
    async with _client(gateway, token) as client:
        call = asyncio.ensure_future(client.post("/v2/models/chat/infer", json=INFER))
        for _ in range(100):
            if any(a.seen for a in agents):
                break
            await asyncio.sleep(0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    for _ in range(100):
        if sum(a.cancelled for a in agents):
            break
        await asyncio.sleep(0.02)
    await gateway.close()
    assert sum(a.cancelled for a in agents) == 1


async def test_concurrency_over_a_tokens_limit_gets_429_with_retry_after(fleet):
    agents, _, token = fleet
    for agent in agents:
        agent.delay = 0.3
    gateway = _gateway(token_concurrency=2)
    async with _client(gateway, token) as client:
        answers = await asyncio.gather(*(client.post("/v2/models/chat/infer", json=INFER) for _ in range(3)))
    await gateway.close()
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 200, 429]
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert "2 requests in flight" in refused.json()["error"]


async def test_a_body_over_the_limit_gets_413_and_reaches_no_agent(fleet):
    agents, _, token = fleet
    gateway = _gateway(max_body_bytes=1000)
    async with _client(gateway, token) as client:
        r = await client.post("/v1/completions", json={"model": "chat", "prompt": "x" * 2000})
    await gateway.close()
    assert r.status_code == 413
    assert "1000" in r.json()["error"]["message"]
    assert not any(a.seen for a in agents)


async def test_an_unknown_model_gets_404_naming_it(fleet):
    _, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        r = await client.post("/v1/completions", json={"model": "nope", "prompt": "hi"})
        bad = await client.post("/v1/completions", content=b"{not json")
    await gateway.close()
    assert r.status_code == 404 and "'nope'" in r.json()["error"]["message"]
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]


async def test_streams_pass_through_event_by_event(fleet):
    _, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        async with client.stream("POST", "/v1/chat/completions", json={"model": "chat", "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line async for line in r.aiter_lines() if line.startswith("data:")]
    await gateway.close()
    assert events[-1] == "data: [DONE]" and len(events) == 4


async def test_a_long_answer_of_unknown_length_passes_through_unbuffered(fleet):
    _, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        async with client.stream("POST", "/v2/models/chat/infer", json={"id": "big", "inputs": []}) as r:
            assert r.headers["content-type"] == "application/json; charset=utf-8"
            assert "content-length" not in r.headers  # relayed as it comes, not read whole first
            body = json.loads(await r.aread())
    await gateway.close()
    assert r.status_code == 200 and len(body["outputs"][0]["data"]) == 50001


async def test_models_lists_deployments_and_adapters_with_their_state(fleet):
    _, _, token = fleet

    def more():
        dep = create_deployment("cold-one", "tiny", min_replicas=0, max_replicas=1)
        Replica.objects.create(deployment=dep, index=0, desired_state="sleeping", observed_state="sleeping",
                               host=Host.objects.get(name="h1"))

    await sync_to_async(more)()
    gateway = _gateway()
    async with _client(gateway, token) as client:
        r = await client.get("/v1/models")
        ready = await client.get("/v2/models/chat/ready")
        asleep = await client.get("/v2/models/cold-one/ready")
    await gateway.close()
    states = {m["id"]: m["state"] for m in r.json()["data"]}
    assert states == {"chat": "ready", "cold-one": "asleep"}
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert asleep.status_code == 503 and "the next request wakes it" in asleep.json()["error"]


async def test_a_request_waits_for_a_replica_and_flows_when_it_becomes_ready(fleet):
    agents, hosts, token = fleet

    def asleep():
        Replica.objects.filter(deployment__name="chat").update(desired_state="sleeping", observed_state="sleeping")

    await sync_to_async(asleep)()
    gateway = _gateway()
    async with _client(gateway, token) as client:
        call = asyncio.ensure_future(client.post("/v2/models/chat/infer", json=INFER))
        demand = 0
        for _ in range(100):  # the gateway announces demand for the scheduler to act on
            demand = await sync_to_async(lambda: Deployment.objects.get(name="chat").demand)()
            if demand:
                break
            await asyncio.sleep(0.02)
        assert demand == 1 and not call.done()
        await sync_to_async(lambda: Replica.objects.filter(deployment__name="chat", index=1).update(
            desired_state="ready", observed_state="ready"))()
        gateway.poke()
        r = await asyncio.wait_for(call, 5)
    await gateway.close()
    assert r.status_code == 200
    assert r.headers["x-modelgrid-replica"] == "chat#1"
    assert float(r.headers["x-modelgrid-queue-ms"]) > 0


async def test_waiting_requests_get_503_with_the_schedulers_reason_when_it_refuses(fleet):
    _, _, token = fleet
    await sync_to_async(lambda: Replica.objects.filter(deployment__name="chat").delete())()
    gateway = _gateway(queue_wait_s=30)
    async with _client(gateway, token) as client:
        call = asyncio.ensure_future(client.post("/v1/completions", json={"model": "chat", "prompt": "hi"}))
        for _ in range(100):
            if await sync_to_async(lambda: Deployment.objects.get(name="chat").demand)():
                break
            await asyncio.sleep(0.02)
        await sync_to_async(lambda: Deployment.objects.filter(name="chat").update(
            demand_status="refused", demand_reason="needs 9.00 GiB; no GPU can ever hold it"))()
        gateway.poke()
        r = await asyncio.wait_for(call, 5)
    await gateway.close()
    assert r.status_code == 503
    assert "no GPU can ever hold it" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) > 0


async def test_a_request_that_waits_too_long_gets_503_saying_so(fleet):
    _, _, token = fleet
    await sync_to_async(lambda: Replica.objects.filter(deployment__name="chat").delete())()
    gateway = _gateway(queue_wait_s=0.3)
    async with _client(gateway, token) as client:
        r = await client.post("/v2/models/chat/infer", json=INFER)
    await gateway.close()
    assert r.status_code == 503
    assert "within 0.3 s" in r.json()["error"]


async def test_metrics_need_a_token_and_count_requests(fleet):
    _, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        await client.post("/v2/models/chat/infer", json=INFER)
        r = await client.get("/metrics")
    async with _client(gateway) as client:
        anonymous = await client.get("/metrics")
    await gateway.close()
    assert anonymous.status_code == 401
    assert 'modelgrid_gateway_requests_total{adapter="",code="200",deployment="chat"} 1.0' in r.text


async def test_a_token_limited_to_some_deployments_may_not_read_the_fleets_metrics(fleet):
    _, _, token = fleet

    def limited() -> str:
        user = get_user_model().objects.get(username="client")
        return ApiToken.issue(user, scope=Scope.INFERENCE, deployments=["chat"])[1]

    gateway = _gateway()
    async with _client(gateway, await sync_to_async(limited)()) as client:
        answers = [await client.get(path) for path in ("/metrics", "/metrics/agents", "/metrics/agents/h1")]
        served = await client.post("/v2/models/chat/infer", json=INFER)
    await gateway.close()
    assert served.status_code == 200
    for r in answers:
        assert r.status_code == 403
        assert "limited to deployments" in r.json()["error"]


async def test_a_deeply_nested_or_huge_body_is_refused_naming_the_limit_and_reaches_no_agent(fleet):
    agents, _, token = fleet
    nested = b"[" * 100_000 + b"]" * 100_000

    def completion(prompt: bytes) -> bytes:
        return b'{"model": "chat", "prompt": ' + prompt + b"}"

    gateway = _gateway()
    async with _client(gateway, token) as client:
        deep_v1 = await client.post("/v1/completions", content=completion(nested))
        deep_v2 = await client.post("/v2/models/chat/infer", content=b'{"parameters": {"adapter": ' + nested + b"}}")
        past_limit = await client.post("/v1/completions", content=completion(b"[" * 32 + b"]" * 32))  # 33 with {}
        long_int = await client.post("/v1/completions", content=completion(b"[" + b"9" * 5000 + b"]"))
        huge = await client.post("/v1/completions", content=completion(b'"' + b"x" * (100 << 20) + b'"'))
        many = await client.post("/v1/completions", content=completion(b"[" + b"1," * (1 << 20) + b"1]"))
        at_limit = await client.post("/v1/completions", content=completion(b"[" * 31 + b"]" * 31))
    await gateway.close()
    depth = "the request body nests arrays and objects more than 32 levels deep, the most this gateway takes"
    assert (deep_v1.status_code, deep_v1.json()["error"]["message"]) == (400, depth)
    assert (deep_v2.status_code, deep_v2.json()["error"]) == (400, depth)
    assert (past_limit.status_code, past_limit.json()["error"]["message"]) == (400, depth)
    assert long_int.status_code == 400 and "not valid JSON" in long_int.json()["error"]["message"]
    assert huge.status_code == 413 and "at most 16777216" in huge.json()["error"]["message"]
    assert many.status_code == 413 and "this gateway takes at most 1048576" in many.json()["error"]["message"]
    assert at_limit.status_code == 200
    assert [body for a in agents for _, body in a.seen] == [completion(b"[" * 31 + b"]" * 31)]  # only that one


async def test_the_agent_is_told_which_replica_the_gateway_picked(fleet):
    agents, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        r = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    await gateway.close()
    ids = dict(await sync_to_async(lambda: list(Replica.objects.values_list("index", "pk")))())
    label = r.headers["x-modelgrid-replica"]
    assert [p for a in agents for p in a.picked] == [str(ids[int(label.split("#")[1])])]


async def test_vllm_endpoints_pass_and_v2_to_a_vllm_deployment_is_refused_naming_the_engine(fleet):
    agents, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        for path in ("/v1/responses", "/tokenize", "/detokenize"):
            r = await client.post(path, json={"model": "chat", "prompt": "hi"})
            assert r.status_code == 200 and r.json()["path"] == path
        await sync_to_async(Deployment.objects.filter(name="chat").update)(engine="vllm")
        await gateway.refresh()
        r = await client.post("/v2/models/chat/infer", json=INFER)
    await gateway.close()
    assert r.status_code == 400 and "runs on the vllm engine" in r.json()["error"]
    assert sum(len(a.seen) for a in agents) == 3  # the refused request reached no agent


async def test_health_answers_where_clients_of_openai_servers_look_without_a_token(fleet):
    gateway = _gateway()
    async with _client(gateway) as client:
        r = await client.get("/health")
    await gateway.close()
    assert r.status_code == 200 and r.json() == {"ready": True}


async def test_requests_sharing_a_long_prefix_land_on_one_replica_and_the_answer_says_why(fleet):
    agents, _, token = fleet
    system = "You are a support agent for ModelGrid. Answer briefly and cite the docs. " * 30  # ~2.2 KB
    gateway = _gateway()
    async with _client(gateway, token) as client:  # one after another: least outstanding alone would alternate
        completions = [await client.post("/v1/completions", json={"model": "chat", "prompt": system + f"Q{i}?"})
                       for i in range(6)]
        chats = [await client.post("/v1/chat/completions", json={"model": "chat", "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": f"Q{i}?"}]}) for i in range(4)]
    await gateway.close()
    assert all(r.status_code == 200 for r in completions + chats)
    assert len({r.headers["x-modelgrid-replica"] for r in completions}) == 1
    assert len({r.headers["x-modelgrid-replica"] for r in chats}) == 1
    assert [r.headers["x-modelgrid-routing"] for r in completions] == ["least-outstanding"] + ["prefix 8/8"] * 5
    assert chats[1].headers["x-modelgrid-routing"] == "prefix 8/8"


async def test_with_prefix_routing_off_a_shared_prefix_alternates_by_outstanding_requests(fleet):
    _, _, token = fleet
    gateway = _gateway(prefix_routing=False)
    async with _client(gateway, token) as client:
        answers = [await client.post("/v1/completions", json={"model": "chat", "prompt": "same " * 500 + str(i)})
                   for i in range(4)]
    await gateway.close()
    assert len({r.headers["x-modelgrid-replica"] for r in answers}) == 2
    assert {r.headers["x-modelgrid-routing"] for r in answers} == {"least-outstanding"}
