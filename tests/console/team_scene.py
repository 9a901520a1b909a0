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


# What team b must never read of team a's: its model's, deployment's, adapter's and route's names, its team's name,
# and the name of alice's own token (its prefix is added by shared_scene).
TEAM_A_NAMES = ("tiny-a", "chat-a", "sql-a", "route-a", "team-a", "alice-ci-key", "gone-a")


@dataclass
class SharedScene:
    """The team scene on one shared host, with everything that names a deployment somewhere in the console."""

    teams: TeamScene
    secrets: tuple[str, ...]  # team a's names team b must never read (TEAM_A_NAMES and alice's token prefixes)
    token_ids: dict[str, int]  # user -> the id of a token of theirs


def shared_scene(root: Path) -> SharedScene:
    """The team scene with both deployments' replicas on one host h1 (one GPU), each with a route, replica events on
    the host, a memory sample of each load, request rates and usage counted per team, an alert each, and a token of
    each member's own: all that the console shows of a deployment outside its own page. Team a also had a deployment
    `gone-a`, deleted: its events and its resolved alert outlive it."""
    from django.utils import timezone

    from console.alerts.models import Alert, AlertRule
    from console.catalog.models import Calibration, MemorySample, Model
    from console.deployments.services import delete_deployment
    from console.events.record import Note, record, replica_object
    from console.fleet.models import Gpu
    from console.routes.services import create_route
    from console.series.sampler import sample
    from console.usage.store import write

    scene = team_scene(root)
    host = Host.objects.create(name="h1", endpoint="http://127.0.0.1:9", connected=True, serving={})
    gpu = Gpu.objects.create(host=host, index=0, uuid="SIM-0", name="sim", total_bytes=24 << 30, simulated=True)
    users = {u.username: u for u in get_user_model().objects.all()}
    now = timezone.now()
    rules = {r.kind: r for r in AlertRule.in_force()}
    tokens, secrets = {}, list(TEAM_A_NAMES)
    for side, user in (("a", "alice"), ("b", "bob")):
        dep = Deployment.objects.get(name=f"chat-{side}")
        team = getattr(scene, side)
        replica = Replica.objects.create(deployment=dep, index=0, host=host, desired_state="ready",
                                         observed_state="ready", reserved_bytes=2 << 30, measured_bytes=1 << 30,
                                         reason=f"placed chat-{side}#0 on h1/0", observed_reason="")
        replica.gpus.add(gpu)
        record([Note(replica_object(dep.name, 0), "Ready", f"chat-{side} loaded from tiny-{side}", actor="agent h1",
                     deployment=dep.name, host="h1")])
        create_route(f"route-{side}", [{"deployment": dep.name, "weight": 1}], team=team)
        row, _ = ApiToken.issue(users[user], f"{user}-ci-key")
        tokens[user] = row.pk
        if side == "a":
            secrets += [t.prefix for t in ApiToken.objects.filter(user=users[user])]
        MemorySample.objects.create(load_key=f"h1/chat-{side}/1", model=Model.objects.get(name=f"tiny-{side}"),
                                    deployment=dep.name, family="llama", architecture="LlamaForCausalLM",
                                    device="cpu", dtype="float32", batch=1, seq=64, estimated_bytes=1 << 30,
                                    calibrated_bytes=1 << 30, measured_bytes=1 << 30)
        Deployment.objects.filter(pk=dep.pk).update(traffic_rps=5.0 if side == "a" else 2.0)
        minute = int(now.timestamp()) // 60 * 60
        write({(minute, team.pk, row.pk, dep.name): [3, 0, 10, 20, 0.1]})
        Alert.objects.create(rule=rules["slo_violation"], object=f"deployment/{dep.name}",
                             message=f"chat-{side} misses its SLO", since=now)
    create_deployment("gone-a", "tiny-a", min_replicas=0, max_replicas=1, actor="user alice")
    Alert.objects.create(rule=rules["replica_failing"], object="replica/gone-a#0", message="gone-a failed",
                         since=now, resolved_at=now)
    delete_deployment("gone-a", actor="user alice")
    Calibration.objects.create(family="llama", device="cpu", factor=1.0, samples=2)
    sample(now)
    return SharedScene(scene, tuple(secrets), tokens)
