"""PATCH /api/v1/adapters/{name}: an adapter's directory is changed (or read again) as registration reads it and
checked against its deployment's base model, refused with the same reasons and nothing stored; a changed artifact
gets a new pool estimate and a rollout of its deployment's replicas. Pinning changes no artifact: no restart. The
probe: PATCH answered 405."""

import pytest

from console.catalog.models import Adapter
from console.control.desired import desired_rows_by_host
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.events.models import Event
from tests.adapter_files import write_adapter
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
UP = "model.layers.0.mlp.up_proj"  # the conftest model's [32, 16] weight


@pytest.fixture
def sql(api, host, model, tmp_path):
    dep = create_deployment("chat", "tiny")
    Replica.objects.create(deployment=dep, index=0, host=host, observed_state="ready", pid=41)
    path = write_adapter(tmp_path / "sql-v1", {UP: (4, 16, 32)}, r=4)
    assert api.post("/api/v1/adapters", {"name": "sql", "deployment": "chat", "path": str(path)}).status_code == 201
    return Adapter.objects.get()


def test_a_new_directory_is_read_checked_and_rolled_out(api, sql, host, tmp_path):
    before = Deployment.objects.get()
    v2 = write_adapter(tmp_path / "sql-v2", {UP: (16, 16, 32)}, r=16, seed=3)
    r = api.patch("/api/v1/adapters/sql", {"path": str(v2)})
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["name"], body["deployment"], body["rank"], body["path"]) == ("sql", "chat", 16, str(v2.resolve()))
    assert body["nbytes"] == 4 * sql.nbytes
    dep = Deployment.objects.get()
    assert dep.estimates["cuda"]["adapter_pool_bytes"] == body["nbytes"]
    assert dep.revision == before.revision + 1
    replica = Replica.objects.get()
    assert replica.held == {"revision": before.revision, "model_path": dep.model.path, "adapters": {"sql": sql.path}}
    # Until the rollout reaches it, the replica is told to run what it runs.
    [row] = desired_rows_by_host([host.pk])[host.pk]
    assert row["adapters"] == [{"name": "sql", "path": sql.path, "pinned": False}]
    assert row.get("revision", 0) == before.revision
    [event] = Event.objects.filter(object="adapter/sql", reason="Updated")
    assert "rank 4 -> 16" in event.message and str(v2.resolve()) in event.message


def test_pinning_changes_no_artifact_and_restarts_nothing(api, sql, host):
    r = api.patch("/api/v1/adapters/sql", {"pinned": True})
    assert r.status_code == 200, r.content
    assert r.json()["pinned"] is True and Adapter.objects.get().pinned
    assert Deployment.objects.get().revision == 0
    assert not Replica.objects.exclude(held={}).exists()
    [row] = desired_rows_by_host([host.pk])[host.pk]
    assert row["adapters"] == [{"name": "sql", "path": sql.path, "pinned": True}]
    [event] = Event.objects.filter(object="adapter/sql", reason="Updated")
    assert "pinned" in event.message


def test_the_same_directory_unchanged_is_no_change(api, sql):
    r = api.patch("/api/v1/adapters/sql", {"path": sql.path})
    assert r.status_code == 200, r.content
    assert Deployment.objects.get().revision == 0
    assert not Event.objects.filter(reason="Updated").exists()


@pytest.mark.parametrize("case", [
    lambda tmp: (tmp / "nowhere", "no such directory in the model roots"),
    lambda tmp: (write_adapter(tmp / "wide", {UP: (8, 64, 32)}), f"adapter targets {UP} with in=64"),
])
def test_a_refused_directory_is_a_422_with_the_reason_and_nothing_changes(api, sql, tmp_path, case):
    path, message = case(tmp_path)
    before = Deployment.objects.get()
    r = api.patch("/api/v1/adapters/sql", {"path": str(path)})
    assert r.status_code == 422, r.content
    assert message in refusal(r) and r.json()["detail"][0]["loc"] == ["body", "path"]
    kept = Adapter.objects.get()
    assert (kept.path, kept.rank, kept.nbytes) == (sql.path, sql.rank, sql.nbytes)
    dep = Deployment.objects.get()
    assert (dep.estimates, dep.revision) == (before.estimates, before.revision)
    assert not Replica.objects.exclude(held={}).exists()


@pytest.mark.parametrize("body", [{"name": "other"}, {"deployment": "chat"}, {"rank": 8}, {"pinned": "yes"}])
def test_its_name_deployment_and_figures_cannot_be_changed(api, sql, body):
    r = api.patch("/api/v1/adapters/sql", body)
    assert r.status_code == 422, r.content
    assert Adapter.objects.get().name == "sql"


def test_an_unknown_adapter_is_a_404(api, db):
    r = api.patch("/api/v1/adapters/ghost", {"pinned": True})
    assert r.status_code == 404
    assert "no adapter named 'ghost'" in refusal(r)
