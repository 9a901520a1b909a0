"""Routes at the gateway: a public model name sent to deployments by weight (a canary split), each branch with its
adapter, the fallback taken once when a branch is refused or overloaded, and x-modelgrid-route naming what served.
Real database rows and fake agents on loopback, as in test_gateway.py."""

from __future__ import annotations

import asyncio
import json
import math
import random

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async

from console.catalog.adapters import register_adapter
from console.catalog.services import register_model
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.gateway.routes import BranchView, RouteView
from console.routes.services import create_route, update_route
from tests.adapter_files import write_adapter
from tests.console.gateway.test_gateway import INFER, FakeAgent, _client, _gateway, _host, _ready_replica, _token

pytestmark = pytest.mark.django_db(transaction=True)
UP = "model.layers.0.mlp.up_proj"


class PickyAgent(FakeAgent):
    """A fake agent that answers 503 (overloaded, as a busy engine does) for the models in `overloaded`, and 404 (as
    an agent that no longer runs them: their deployment was deleted) for those in `gone`."""

    def __init__(self, secret: str, name: str) -> None:
        super().__init__(secret, name)
        self.overloaded: set[str] = set()
        self.gone: set[str] = set()

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.read()
        model = request.match_info.get("name") or json.loads(body).get("model")
        if model in self.gone:
            self.seen.append((request.path, body))
            return web.json_response({"error": {"message": f"model {model!r} is not served by this agent",
                                                "type": "invalid_request_error", "param": None,
                                                "code": "model_not_found"}}, status=404)
        if model in self.overloaded:
            self.seen.append((request.path, body))
            return web.json_response({"error": f"model {model!r} is overloaded"}, status=503,
                                     headers={"Retry-After": "1"})
        return await super().answer(request)


@pytest.fixture
async def fleet(model_dir, tmp_path):
    """Deployments chat (a replica on h1), canary (on h2) and spare (on h1); adapter sql on chat; a token."""
    agents, hosts = [], []
    for name in ("h1", "h2"):
        agent = PickyAgent("", name)
        endpoint = await agent.start()
        host, agent.secret = await sync_to_async(_host)(name, endpoint)
        agents.append(agent)
        hosts.append(host)

    def rows():
        register_model("tiny", str(model_dir))
        for name, host in (("chat", hosts[0]), ("canary", hosts[1]), ("spare", hosts[0])):
            _ready_replica(create_deployment(name, "tiny"), 0, host)
        register_adapter("sql", "chat", str(write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})))
        return _token()

    token = await sync_to_async(rows)()
    yield agents, token
    for agent in agents:
        await agent.runner.cleanup()


def _models(agents) -> list[str]:
    """The model each request that reached an agent named, in order (OpenAI bodies)."""
    return [json.loads(body)["model"] for agent in agents for _, body in agent.seen]


async def test_a_route_splits_requests_by_weight_within_binomial_bounds(fleet):
    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "chat", "weight": 95},
                                                    {"deployment": "canary", "weight": 5}])
    gateway = _gateway()
    gateway.rng = random.Random(39)
    n, p = 2000, 0.05
    async with _client(gateway, token) as client:
        answers = []
        for _ in range(n // 40):  # 40 at a time: within the token's concurrency limit
            answers += await asyncio.gather(*(client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
                                              for _ in range(40)))
    await gateway.close()
    assert all(r.status_code == 200 for r in answers), {r.text for r in answers if r.status_code != 200}
    routes = [r.headers["x-modelgrid-route"] for r in answers]
    assert set(routes) == {"assistant -> chat", "assistant -> canary"}
    canary = routes.count("assistant -> canary")
    # 4.5 standard deviations of the binomial either side: a correct split fails this once in ~150,000 runs.
    bound = 4.5 * math.sqrt(n * p * (1 - p))
    assert abs(canary - n * p) <= bound, (canary, n * p, bound)
    # What the header says is what ran: the canary's requests reached its replica, named as the deployment.
    assert sum(r.headers["x-modelgrid-replica"] == "canary#0" for r in answers) == canary
    assert _models(agents).count("canary") == canary


async def test_a_branch_with_an_adapter_sends_the_adapters_name_on_both_apis(fleet):
    agents, token = fleet
    await sync_to_async(create_route)("sql-latest", [{"deployment": "chat", "adapter": "sql"}])
    gateway = _gateway()
    async with _client(gateway, token) as client:
        openai = await client.post("/v1/completions", json={"model": "sql-latest", "prompt": "x", "max_tokens": 3})
        v2 = await client.post("/v2/models/sql-latest/infer", json=INFER)
    await gateway.close()
    assert openai.status_code == v2.status_code == 200, (openai.text, v2.text)
    assert openai.headers["x-modelgrid-route"] == v2.headers["x-modelgrid-route"] == "sql-latest -> chat/sql"
    (path, body), (v2_path, v2_body) = agents[0].seen
    assert json.loads(body) == {"model": "sql", "prompt": "x", "max_tokens": 3}  # the rest of the body as sent
    assert v2_path == "/v2/models/sql/infer" and json.loads(v2_body) == INFER


async def test_a_refused_or_overloaded_branch_falls_back_once(fleet):
    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}], fallback="spare")
    agents[1].overloaded = {"canary"}
    gateway = _gateway()
    async with _client(gateway, token) as client:
        overloaded = await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
        agents[0].overloaded = {"spare"}  # the fallback is overloaded too: its answer stands, no third try
        both = await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
    await gateway.close()
    assert overloaded.status_code == 200, overloaded.text
    assert overloaded.headers["x-modelgrid-route"] == "assistant -> spare (fallback: canary answered 503)"
    assert overloaded.headers["x-modelgrid-replica"] == "spare#0"
    assert both.status_code == 503 and "'spare' is overloaded" in both.text
    assert both.headers["x-modelgrid-route"] == "assistant -> spare (fallback: canary answered 503)"
    assert _models(agents).count("canary") == 2 and _models(agents).count("spare") == 2


async def test_a_branch_without_a_replica_in_time_falls_back_and_one_without_fallback_says_why(fleet):
    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}], fallback="chat")
    await sync_to_async(create_route)("alone", [{"deployment": "canary"}])
    await sync_to_async(Replica.objects.filter(deployment__name="canary").delete)()
    gateway = _gateway(queue_wait_s=0.2)
    async with _client(gateway, token) as client:
        fell_back = await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
        refused = await client.post("/v1/completions", json={"model": "alone", "prompt": "x"})
    await gateway.close()
    assert fell_back.status_code == 200 and fell_back.json()["agent"] == "h1"
    assert fell_back.headers["x-modelgrid-route"] == "assistant -> chat (fallback: canary answered 503)"
    assert refused.status_code == 503 and "no replica of model 'canary'" in refused.json()["error"]["message"]
    assert refused.headers["x-modelgrid-route"] == "alone -> canary"


async def test_changing_a_route_moves_traffic_without_a_restart(fleet):
    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "chat"}])
    gateway = _gateway()
    async with _client(gateway, token) as client:
        before = await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
        await sync_to_async(update_route)("assistant", {"branches": [{"deployment": "canary"}]})
        await gateway.refresh()  # what the next snapshot does, within a second of the change
        after = await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
        listed = (await client.get("/v1/models")).json()["data"]
        card = (await client.get("/v1/models/assistant")).json()
    await gateway.close()
    assert before.headers["x-modelgrid-route"] == "assistant -> chat"
    assert after.headers["x-modelgrid-route"] == "assistant -> canary"
    assert {"chat", "canary", "spare", "sql", "assistant"} <= {m["id"] for m in listed}
    assert card["id"] == "assistant" and card["route"] == [{"deployment": "canary", "adapter": None, "weight": 1}]
    assert card["state"] == "ready" and card["fallback"] is None


def test_a_weighted_choice_follows_the_running_sums():
    route = RouteView("r", (BranchView("a", None, 95), BranchView("b", None, 5)))
    assert [route.choose(d).deployment for d in (0.0, 0.9499, 0.95, 0.9999)] == ["a", "a", "b", "b"]
    assert RouteView("empty", ()).choose(0.5) is None


async def test_a_route_is_ready_on_v2_and_hidden_from_a_token_limited_to_none_of_its_deployments(fleet):
    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}], fallback="chat")

    def limited():
        from django.contrib.auth import get_user_model

        from console.accounts.models import ApiToken

        return ApiToken.issue(get_user_model().objects.get(), name="spare-only", deployments=["spare"])[1]

    spare_only = await sync_to_async(limited)()
    gateway = _gateway()
    async with _client(gateway, token) as client:
        ready = await client.get("/v2/models/assistant/ready")
    async with _client(gateway, spare_only) as client:
        listed = {m["id"] for m in (await client.get("/v1/models")).json()["data"]}
        card = await client.get("/v1/models/assistant")
        v2 = await client.get("/v2/models/assistant/ready")
    await gateway.close()
    assert ready.status_code == 200 and ready.json() == {"name": "assistant", "ready": True}
    assert listed == {"spare"}
    assert card.status_code == v2.status_code == 404


async def test_a_request_that_falls_back_counts_once_against_its_tokens_requests_per_minute(fleet):
    from console.accounts.models import ApiToken

    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}], fallback="spare")
    await sync_to_async(lambda: ApiToken.objects.filter(prefix=ApiToken.lookup(token).prefix).update(rpm_limit=2))()
    agents[1].overloaded = {"canary"}
    gateway = _gateway()
    async with _client(gateway, token) as client:
        answers = [await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
                   for _ in range(3)]
    await gateway.close()
    assert [r.status_code for r in answers] == [200, 200, 429], [r.text for r in answers]
    # The token's own limit is not taken to the fallback: the same token would meet it there.
    assert _models(agents).count("canary") == _models(agents).count("spare") == 2
    assert answers[2].headers["x-modelgrid-route"] == "assistant -> canary"


async def test_a_route_whose_deployments_were_all_deleted_is_listed_and_says_why_it_cannot_serve(fleet):
    from console.deployments.services import delete_deployment

    _, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}])
    await sync_to_async(delete_deployment)("canary")
    gateway = _gateway()
    async with _client(gateway, token) as client:
        listed = await client.get("/v1/models")
        answer = await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
    await gateway.close()
    assert listed.status_code == 200
    (card,) = [m for m in listed.json()["data"] if m["id"] == "assistant"]
    assert card["route"] == []
    assert answer.status_code == 503 and "route 'assistant' has no branches left" in answer.text


class FirstBranch:
    """Draws that choose a route's first branch; `then` runs as the draw is made (between choosing and sending)."""

    def __init__(self, then=lambda: None) -> None:
        self.then = then

    def random(self) -> float:
        self.then()
        return 0.0


async def test_a_branch_whose_deployment_its_agent_no_longer_runs_is_retried_once_on_a_live_branch(fleet):
    from console.accounts.models import ApiToken

    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}, {"deployment": "chat"}])
    await sync_to_async(lambda: ApiToken.objects.filter(prefix=ApiToken.lookup(token).prefix).update(rpm_limit=2))()
    agents[1].gone = {"canary"}  # deleted: its agent stopped it before the gateway's snapshot said so
    gateway = _gateway()
    gateway.rng = FirstBranch()
    async with _client(gateway, token) as client:
        answers = [await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
                   for _ in range(3)]
    await gateway.close()
    assert [r.status_code for r in answers] == [200, 200, 429], [r.text for r in answers]
    assert answers[0].headers["x-modelgrid-route"] == "assistant -> chat (retried: canary answered 404)"
    assert answers[0].headers["x-modelgrid-replica"] == "chat#0"
    # Retried, the request counts once against the token's requests per minute: the third is the one refused.
    assert _models(agents).count("canary") == _models(agents).count("chat") == 2


async def test_a_branch_deleted_between_choosing_it_and_sending_is_retried_once_on_a_live_branch(fleet):
    from console.deployments.services import delete_deployment

    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}, {"deployment": "spare"}],
                                      fallback="chat")
    gateway = _gateway()

    async def still() -> None:  # the snapshot changes when this test says so only
        await asyncio.Event().wait()

    gateway._refresher = still
    await gateway.ensure_started()
    before = gateway.fleet
    await sync_to_async(delete_deployment)("canary")
    await gateway.refresh()
    after = gateway.fleet
    gateway.fleet = before

    def deleted_now() -> None:
        gateway.fleet = after

    gateway.rng = FirstBranch(deleted_now)
    async with _client(gateway, token) as client:
        answer = await client.post("/v1/completions", json={"model": "assistant", "prompt": "x"})
    await gateway.close()
    assert answer.status_code == 200, answer.text
    # Another branch, not the fallback: the route's own split still holds while a branch is deleted.
    assert answer.headers["x-modelgrid-route"] == "assistant -> spare (retried: canary answered 404)"
    assert _models(agents) == ["spare"]


async def test_a_request_waiting_on_a_branch_that_is_deleted_meanwhile_is_retried_on_a_live_branch(fleet):
    # Deleting a deployment: its agent drains its replica (a 503 that nothing ran), so the request waits in the queue
    # for another replica of it, and the deployment is gone before one comes.
    from console.deployments.services import delete_deployment

    agents, token = fleet
    await sync_to_async(create_route)("assistant", [{"deployment": "canary"}, {"deployment": "spare"}])
    agents[1].draining = True
    gateway = _gateway()
    gateway.rng = FirstBranch()
    async with _client(gateway, token) as client:
        call = asyncio.ensure_future(client.post("/v1/completions", json={"model": "assistant", "prompt": "x"}))
        for _ in range(200):
            if agents[1].seen or call.done():
                break
            await asyncio.sleep(0.02)
        await sync_to_async(delete_deployment)("canary")
        await gateway.refresh()
        answer = await asyncio.wait_for(call, 10)
    await gateway.close()
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-modelgrid-route"] == "assistant -> spare (retried: canary answered 404)"
    assert sorted(_models(agents)) == ["canary", "spare"]
