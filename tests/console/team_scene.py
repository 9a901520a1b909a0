"""Two teams that must not see each other's objects: team `a` (user alice) and team `b` (user bob), each with a
model, a deployment of it and an adapter on that, and an admin (staff, in no team) who sees both."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken, Team
from console.catalog.adapters import register_adapter
from console.catalog.services import register_model
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.fleet.models import Host
from tests.adapter_files import write_adapter
from tests.conftest import write_model_dir

UP = "model.layers.0.mlp.up_proj"  # write_model_dir's [32, 16] weight
PASSWORD = "a-long-password"


@dataclass
class TeamScene:
    a: Team
    b: Team
    tokens: dict[str, str]  # user name -> an API token (scope all) of theirs


def team_scene(root: Path) -> TeamScene:
    """Team a owns model `tiny-a`, deployment `chat-a`, adapter `sql-a`; team b the same with `-b`."""
    users = get_user_model().objects
    teams = {}
    for side, user in (("a", "alice"), ("b", "bob")):
        person = users.create_user(user, password=PASSWORD)
        person.teams.clear()  # out of the default team every new user joins
        team = teams[side] = Team.objects.create(name=f"team-{side}")
        team.members.add(person)
        register_model(f"tiny-{side}", str(write_model_dir(root / f"tiny-{side}")), team=team)
        create_deployment(f"chat-{side}", f"tiny-{side}", min_replicas=1, max_replicas=1)
        register_adapter(f"sql-{side}", f"chat-{side}", str(write_adapter(root / f"sql-{side}", {UP: (8, 16, 32)})))
    admin = users.create_user("root", password=PASSWORD, is_staff=True)
    admin.teams.clear()
    tokens = {u.username: ApiToken.issue(u, "bot")[1] for u in users.filter(username__in=["alice", "bob", "root"])}
    return TeamScene(teams["a"], teams["b"], tokens)


def calls_as(client, scene: TeamScene):
    """`call(user, method, url, body=None)`: the REST API with `user`'s token from the scene (a JSON body)."""
    def call(user: str, method: str, url: str, body: dict | None = None):
        extra = {"HTTP_AUTHORIZATION": f"Bearer {scene.tokens[user]}"}
        if body is not None:
            extra |= {"data": json.dumps(body), "content_type": "application/json"}
        return getattr(client, method)(url, **extra)

    return call


def served_scene(root: Path, endpoint: str) -> TeamScene:
    """The scene with each deployment's one replica ready on host h1, whose agent answers at `endpoint`."""
    scene = team_scene(root)
    host = Host.objects.create(name="h1", endpoint=endpoint, connected=True)
    for dep in Deployment.objects.all():
        Replica.objects.create(deployment=dep, index=0, host=host, desired_state="ready", observed_state="ready")
    return scene
