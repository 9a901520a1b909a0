"""Ownership on the REST API: a team-a token lists, reads, changes and deletes only team a's models, deployments
and adapters; team b's answer 404 as if they did not exist (nothing changes), and an admin's token reaches both."""


import pytest

from console.catalog.models import Adapter, Model
from console.deployments.models import Deployment
from tests.adapter_files import write_adapter
from tests.conftest import write_model_dir
from tests.console.team_scene import UP, calls_as, team_scene
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db

KINDS = (("models", "tiny"), ("deployments", "chat"), ("adapters", "sql"))


@pytest.fixture
def scene(tmp_path):
    return team_scene(tmp_path)


@pytest.fixture
def as_user(client, scene):
    return calls_as(client, scene)


@pytest.mark.parametrize(("kind", "stem"), KINDS)
def test_a_list_shows_only_the_tokens_teams_objects(as_user, kind, stem):
    names = [o["name"] for o in as_user("alice", "get", f"/api/v1/{kind}").json()]
    assert names == [f"{stem}-a"]
    listed = as_user("alice", "get", f"/api/v1/{kind}")
    assert listed.headers["X-Total-Count"] == "1"


@pytest.mark.parametrize(("kind", "stem"), KINDS)
def test_an_admin_lists_every_teams_objects(as_user, kind, stem):
    rows = as_user("root", "get", f"/api/v1/{kind}").json()
    assert sorted((o["name"], o["team"]) for o in rows) == [(f"{stem}-a", "team-a"), (f"{stem}-b", "team-b")]


@pytest.mark.parametrize(("kind", "stem"), KINDS)
def test_another_teams_object_reads_as_missing(as_user, kind, stem):
    own = as_user("alice", "get", f"/api/v1/{kind}/{stem}-a")
    other = as_user("alice", "get", f"/api/v1/{kind}/{stem}-b")
    assert own.status_code == 200 and own.json()["team"] == "team-a"
    assert other.status_code == 404
    assert refusal(other) == f"no {kind[:-1]} named '{stem}-b'"


def test_another_teams_objects_cannot_be_changed(as_user, tmp_path):
    dep = as_user("alice", "patch", "/api/v1/deployments/chat-b", {"max_replicas": 3})
    model = as_user("alice", "patch", "/api/v1/models/tiny-b", {"path": str(tmp_path / "tiny-b")})
    adapter = as_user("alice", "patch", "/api/v1/adapters/sql-b", {"pinned": True})
    assert dep.status_code == model.status_code == adapter.status_code == 404
    assert Deployment.objects.get(name="chat-b").max_replicas == 1
    assert not Adapter.objects.get(name="sql-b").pinned


def test_another_teams_objects_cannot_be_deleted(as_user):
    answers = [as_user("alice", "delete", f"/api/v1/{kind}/{stem}-b").status_code for kind, stem in reversed(KINDS)]
    assert answers == [404, 404, 404]
    assert Adapter.objects.filter(name="sql-b").exists() and Deployment.objects.filter(name="chat-b").exists()
    assert Model.objects.filter(name="tiny-b").exists()


def test_own_objects_are_changed_and_deleted(as_user):
    assert as_user("alice", "patch", "/api/v1/deployments/chat-a", {"max_replicas": 2}).status_code == 200
    assert as_user("alice", "delete", "/api/v1/adapters/sql-a").status_code == 204
    assert as_user("alice", "delete", "/api/v1/deployments/chat-a").status_code == 204


def test_an_admin_changes_another_teams_deployment(as_user):
    r = as_user("root", "patch", "/api/v1/deployments/chat-b", {"max_replicas": 2})
    assert r.status_code == 200, r.content
    assert Deployment.objects.get(name="chat-b").max_replicas == 2


def test_another_teams_model_cannot_be_deployed_nor_its_deployment_given_an_adapter(as_user, tmp_path):
    dep = as_user("alice", "post", "/api/v1/deployments", {"name": "mine", "model": "tiny-b"})
    assert dep.status_code == 422 and refusal(dep).startswith("no model named 'tiny-b'")
    path = write_adapter(tmp_path / "x", {UP: (8, 16, 32)})
    adapter = as_user("alice", "post", "/api/v1/adapters", {"name": "x", "deployment": "chat-b", "path": str(path)})
    assert adapter.status_code == 422 and refusal(adapter) == "no deployment named 'chat-b'"


def test_what_a_user_creates_belongs_to_their_team(as_user, tmp_path):
    model = as_user("alice", "post", "/api/v1/models", {"name": "m2", "path": str(write_model_dir(tmp_path / "m2"))})
    dep = as_user("alice", "post", "/api/v1/deployments", {"name": "d2", "model": "m2"})
    bulk = as_user("alice", "post", "/api/v1/deployments/bulk", {"deployments": [{"name": "d3", "model": "m2"}]})
    assert (model.status_code, dep.status_code, bulk.status_code) == (201, 201, 201)
    assert model.json()["team"] == dep.json()["team"] == bulk.json()[0]["team"] == "team-a"
    assert as_user("bob", "get", "/api/v1/deployments/d2").status_code == 404


def test_creating_in_a_team_one_is_not_in_is_refused_naming_the_field(as_user, tmp_path):
    path = str(write_model_dir(tmp_path / "m2"))
    r = as_user("alice", "post", "/api/v1/models", {"name": "m2", "path": path, "team": "team-b"})
    assert r.status_code == 422
    assert refused_fields(r) == ["team"]
    assert "alice is not a member of a team named 'team-b'" in refusal(r)
    assert not Model.objects.filter(name="m2").exists()


def test_a_member_of_several_teams_names_the_team_of_a_model(as_user, scene, tmp_path):
    from django.contrib.auth import get_user_model

    scene.b.members.add(get_user_model().objects.get(username="alice"))
    path = str(write_model_dir(tmp_path / "m2"))
    unsaid = as_user("alice", "post", "/api/v1/models", {"name": "m2", "path": path})
    assert unsaid.status_code == 422 and refused_fields(unsaid) == ["team"]
    said = as_user("alice", "post", "/api/v1/models", {"name": "m2", "path": path, "team": "team-b"})
    assert said.status_code == 201 and said.json()["team"] == "team-b"
    # A deployment goes to its model's team unless told otherwise.
    assert as_user("alice", "post", "/api/v1/deployments", {"name": "d2", "model": "m2"}).json()["team"] == "team-b"


def test_replica_logs_of_another_teams_deployment_read_as_missing(as_user):
    r = as_user("alice", "get", "/api/v1/deployments/chat-b/replicas/0/logs")
    assert r.status_code == 404 and refusal(r) == "no deployment named 'chat-b'"


def test_a_token_cannot_be_limited_to_another_teams_deployment(as_user):
    r = as_user("alice", "post", "/api/v1/tokens", {"name": "x", "scope": "inference", "deployments": ["chat-b"]})
    assert r.status_code == 422
    assert refusal(r) == "deployments: no deployment named 'chat-b'; GET /api/v1/deployments lists them"


def test_another_teams_deployment_series_read_as_missing(as_user):
    assert as_user("alice", "get", "/api/v1/deployments/chat-a/series?metric=request_rate").status_code == 200
    r = as_user("alice", "get", "/api/v1/deployments/chat-b/series?metric=request_rate")
    assert r.status_code == 404 and refusal(r) == "no deployment named 'chat-b'"


def test_the_timeline_leaves_out_another_teams_objects(as_user):
    def objects(user: str) -> set[str]:
        return {e["object"] for e in as_user(user, "get", "/api/v1/events?limit=500").json()["events"]}

    mine, everything = objects("alice"), objects("root")
    assert {"model/tiny-a", "deployment/chat-a", "adapter/sql-a"} <= mine
    assert not mine & {"model/tiny-b", "deployment/chat-b", "adapter/sql-b", "team/team-b"}
    assert {"model/tiny-b", "deployment/chat-b", "adapter/sql-b"} <= everything
    r = as_user("alice", "get", "/api/v1/events?object=deployment/chat-b")
    assert r.status_code == 200 and r.json()["events"] == []


def test_hosts_show_another_teams_replicas_unnamed(as_user):
    from console.deployments.models import Replica
    from console.fleet.models import Gpu, Host

    host = Host.objects.create(name="h1", endpoint="http://127.0.0.1:9", connected=True)
    gpu = Gpu.objects.create(host=host, index=0, uuid="SIM-0", name="sim", total_bytes=8 << 30, simulated=True)
    for dep in Deployment.objects.all():
        Replica.objects.create(deployment=dep, index=0, host=host, desired_state="ready", observed_state="ready",
                               reserved_bytes=1 << 30).gpus.add(gpu)

    def shown(user: str) -> list[str]:
        return sorted(r["deployment"] for r in as_user(user, "get", "/api/v1/hosts/h1").json()["gpus"][0]["replicas"])

    assert shown("alice") == ["another team", "chat-a"]
    assert shown("root") == ["chat-a", "chat-b"]
