"""A route at the gateway is its team's: only that team's tokens (and admins') list it on /v1/models, read its card
and call it; to others its name is unknown (404, as a model nobody has). A route the upgrade left in the default
team over another team's deployment is no way in for the default team's tokens."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from console.accounts.models import DEFAULT_TEAM, Team
from console.deployments.models import Deployment
from console.gateway.routes import load_routes
from console.routes.models import Branch, Route
from console.routes.services import create_route
from tests.console.gateway.test_gateway import _client, _gateway
from tests.console.gateway.test_team_ownership import scene  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_teams_route_is_seen_and_called_by_its_members_only(scene):  # noqa: F811
    await sync_to_async(create_route)("assistant", [{"deployment": "chat-a"}])
    gateway = _gateway()
    async with (_client(gateway, scene.tokens["alice"]) as alice, _client(gateway, scene.tokens["bob"]) as bob,
                _client(gateway, scene.tokens["root"]) as root):
        listed = {u: [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
                  for u, c in (("alice", alice), ("bob", bob), ("root", root))}
        call = await alice.post("/v1/completions", json={"model": "assistant", "prompt": "hi"})
        theirs = await bob.post("/v1/completions", json={"model": "assistant", "prompt": "hi"})
        nobody = await bob.post("/v1/completions", json={"model": "nobody", "prompt": "hi"})
        card = await bob.get("/v1/models/assistant")
    await gateway.close()
    assert "assistant" in listed["alice"] and "assistant" in listed["root"] and "assistant" not in listed["bob"]
    assert call.status_code == 200 and call.headers["x-modelgrid-route"] == "assistant -> chat-a"
    assert theirs.status_code == card.status_code == 404
    assert theirs.json()["error"]["message"] == nobody.json()["error"]["message"].replace("nobody", "assistant")


async def test_a_route_of_another_team_is_unknown_even_over_the_tokens_own_deployment(scene):  # noqa: F811
    def stray():
        route = Route.objects.create(name="stray", team=Team.objects.get_or_create(name=DEFAULT_TEAM)[0])
        Branch.objects.create(route=route, position=0, deployment=Deployment.objects.get(name="chat-a"))

    await sync_to_async(stray)()
    gateway = _gateway()
    async with _client(gateway, scene.tokens["alice"]) as alice, _client(gateway, scene.tokens["root"]) as root:
        listed = [m["id"] for m in (await alice.get("/v1/models")).json()["data"]]
        call = await alice.post("/v1/completions", json={"model": "stray", "prompt": "hi"})
        admin = await root.post("/v1/completions", json={"model": "stray", "prompt": "hi"})
    await gateway.close()
    assert "stray" not in listed and call.status_code == 404
    assert admin.status_code == 200


async def test_the_snapshot_carries_each_routes_team(scene):  # noqa: F811
    await sync_to_async(create_route)("assistant", [{"deployment": "chat-b"}])
    routes = await sync_to_async(load_routes)()
    assert routes["assistant"].team == scene.b.pk
