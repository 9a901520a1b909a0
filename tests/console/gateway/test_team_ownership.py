"""Ownership at the gateway: a team-a token lists only team a's deployments and adapters on /v1/models and the v2
repository index, and calling team b's deployment (or its adapter) answers 404 "does not exist", exactly as a name
nobody has, so a token learns nothing of other teams; an admin's token reaches both. Membership is read with the
token's cached lookup: no database read per request."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from console.fleet.models import AgentCredential
from console.gateway.auth import lookup
from tests.console.gateway.test_gateway import INFER, FakeAgent, _client, _gateway
from tests.console.team_scene import served_scene

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def scene(tmp_path):
    """The team scene, chat-a and chat-b each with a ready replica on host h1 and its fake agent."""
    credential, _ = await sync_to_async(AgentCredential.issue)("h1")
    agent = FakeAgent(credential.gateway_secret, "h1")
    endpoint = await agent.start()

    yield await sync_to_async(served_scene)(tmp_path, endpoint)
    await agent.runner.cleanup()


async def test_models_lists_only_the_tokens_teams_deployments_and_adapters(scene):
    gateway = _gateway()
    async with _client(gateway, scene.tokens["alice"]) as alice, _client(gateway, scene.tokens["root"]) as root:
        mine = await alice.get("/v1/models")
        index = await alice.post("/v2/repository/index", json={})
        everything = await root.get("/v1/models")
    await gateway.close()
    assert [m["id"] for m in mine.json()["data"]] == ["chat-a", "sql-a"]
    assert [e["name"] for e in index.json()] == ["chat-a", "sql-a"]
    assert sorted(m["id"] for m in everything.json()["data"]) == ["chat-a", "chat-b", "sql-a", "sql-b"]


@pytest.mark.parametrize("model", ["chat-b", "sql-b"])
async def test_calling_another_teams_model_answers_as_a_model_nobody_has(scene, model):
    gateway = _gateway()
    async with _client(gateway, scene.tokens["alice"]) as alice:
        openai = await alice.post("/v1/completions", json={"model": model, "prompt": "hi"})
        nobody = await alice.post("/v1/completions", json={"model": "nobody", "prompt": "hi"})
        card = await alice.get(f"/v1/models/{model}")
        ready = await alice.get(f"/v2/models/{model}/ready")
        v2 = await alice.post(f"/v2/models/{model}/infer", json=INFER)
    await gateway.close()
    assert openai.status_code == card.status_code == ready.status_code == v2.status_code == 404
    assert openai.json()["error"]["message"] == nobody.json()["error"]["message"].replace("nobody", model)
    assert openai.json()["error"]["code"] == "model_not_found"
    assert "chat-b" not in v2.json()["error"] or model == "chat-b"  # an adapter's deployment is not named


async def test_a_token_calls_its_own_teams_deployment_and_an_admin_every_teams(scene):
    gateway = _gateway()
    async with _client(gateway, scene.tokens["alice"]) as alice, _client(gateway, scene.tokens["root"]) as root:
        own = await alice.post("/v2/models/chat-a/infer", json=INFER)
        adapter = await alice.post("/v1/completions", json={"model": "sql-a", "prompt": "hi"})
        admin = await root.post("/v2/models/chat-b/infer", json=INFER)
    await gateway.close()
    assert own.status_code == adapter.status_code == admin.status_code == 200, (own.text, adapter.text, admin.text)


async def test_the_cached_caller_carries_its_users_teams(scene):
    alice = await sync_to_async(lookup)(scene.tokens["alice"])
    root = await sync_to_async(lookup)(scene.tokens["root"])
    assert alice.teams == frozenset({scene.a.pk}) and root.teams is None


async def test_a_member_taken_out_of_the_team_stops_reaching_its_deployments(scene):
    def leave():
        scene.a.members.remove(get_user_model().objects.get(username="alice"))

    await sync_to_async(leave)()
    gateway = _gateway()
    async with _client(gateway, scene.tokens["alice"]) as alice:
        listing = await alice.get("/v1/models")
        call = await alice.post("/v2/models/chat-a/infer", json=INFER)
    await gateway.close()
    assert listing.json()["data"] == [] and call.status_code == 404


async def test_a_route_to_another_teams_deployment_is_unknown_to_the_token(scene):
    from console.routes.services import create_route

    await sync_to_async(create_route)("assistant", [{"deployment": "chat-b"}])
    gateway = _gateway()
    async with _client(gateway, scene.tokens["alice"]) as alice, _client(gateway, scene.tokens["bob"]) as bob:
        listing = await alice.get("/v1/models")
        card = await alice.get("/v1/models/assistant")
        theirs = await bob.get("/v1/models/assistant")
        call = await alice.post("/v1/completions", json={"model": "assistant", "prompt": "hi"})
    await gateway.close()
    assert "assistant" not in [m["id"] for m in listing.json()["data"]]
    assert card.status_code == 404 and theirs.status_code == 200
    assert call.status_code == 404 and "chat-b" not in call.text  # the branch is not named either
