"""The dry-run planner: POST /api/v1/plan and manage.py plan run the scheduler core on a described fleet."""

import json

import pytest
from django.core.management import CommandError, call_command

from console.deployments.models import Deployment
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
GiB = 1024**3
DOC = {
    "strategy": "memory-optimized", "buffer_bytes": 0,
    "gpus": [{"id": "h1/0", "host": "h1", "total_bytes": 80 * GiB, "used_bytes": 0, "labels": {"gpu": "a100"}},
             {"id": "h2/0", "host": "h2", "total_bytes": 24 * GiB, "labels": {"gpu": "l4"}}],
    "deployments": [{"name": "m1", "bytes": 20 * GiB, "replicas": 2, "gpus_per_replica": 1, "priority": "standard",
                     "selector": {"gpu": "a100"}, "surprise": "ignored"}],
}


def test_it_plans_the_described_fleet_and_stores_nothing(api):
    r = api.post("/api/v1/plan", DOC)
    assert r.status_code == 200, r.content
    body = r.json()
    assert [(p["deployment"], p["index"], p["gpus"]) for p in body["replicas"]] == [("m1", 0, ["h1/0"]),
                                                                                   ("m1", 1, ["h1/0"])]
    assert body["unplaced"] == [] and body["gpus_used"] == 1
    assert body["memory_utilization"] == pytest.approx(0.5)
    assert isinstance(body["elapsed_ms"], float)
    assert not Deployment.objects.exists()


def test_a_replica_that_fits_nowhere_says_why(api):
    doc = json.loads(json.dumps(DOC))
    doc["deployments"][0]["bytes"] = 50 * GiB
    body = api.post("/api/v1/plan?strategy=balance", doc).json()
    assert [u["index"] for u in body["unplaced"]] == [1]
    assert "needs 50.00 GiB" in body["unplaced"][0]["reason"]
    assert "excluded by label" in body["unplaced"][0]["reason"]
    assert body["strategy"] == "balance"


@pytest.mark.parametrize("doc, message", [
    ({"gpus": [], "deployments": [{"name": "m", "bytes": -1}]}, "deployments[0].bytes"),
    ({"gpus": [{"id": "a/0", "host": "a", "total_bytes": -1}], "deployments": []}, "gpus[0].total_bytes"),
    ({"deployments": []}, "gpus"),
])
def test_a_bad_document_is_a_422_naming_the_field(api, doc, message):
    r = api.post("/api/v1/plan", doc)
    assert r.status_code == 422 and message in refusal(r)


def test_an_unknown_strategy_is_refused(api):
    r = api.post("/api/v1/plan?strategy=random", DOC)
    assert r.status_code == 422 and "strategy must be one of" in refusal(r)


def test_the_command_prints_tables_or_json(tmp_path, capsys):
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(DOC))
    call_command("plan", str(path))
    out = capsys.readouterr().out
    assert "m1" in out and "h1/0" in out and "best fit" in out
    call_command("plan", str(path), "--json", "--strategy", "fill-first")
    body = json.loads(capsys.readouterr().out)
    assert body["strategy"] == "fill-first" and len(body["replicas"]) == 2


def test_the_command_exits_2_naming_the_problem(tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text('{"gpus": [{"id": "a/0"}], "deployments": []}')
    with pytest.raises(CommandError, match=r"gpus\[0\]\.total_bytes is required") as e:
        call_command("plan", str(path))
    assert e.value.returncode == 2
    with pytest.raises(CommandError, match="not valid JSON"):
        path.write_text("{")
        call_command("plan", str(path))


def test_a_deployment_may_name_a_registered_model_or_a_directory_instead_of_bytes(api, model_dir, settings):
    settings.MODEL_ROOTS = [str(model_dir.parent)]
    api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)})
    expected = api.post("/api/v1/estimate", {"model": "tiny", "batch": 4})
    assert expected.status_code == 200, expected.content
    doc = {"gpus": [{"id": "a/0", "total_bytes": 24 * GiB}],
           "deployments": [{"name": "by-name", "model": "tiny", "batch": 4},
                           {"name": "by-path", "model": str(model_dir), "batch": 4}]}
    body = api.post("/api/v1/plan", doc).json()
    reserved = {r["deployment"]: r["reserved_bytes"] for r in body["replicas"]}
    assert reserved == {"by-name": expected.json()["calibrated_bytes"], "by-path": expected.json()["calibrated_bytes"]}


def test_a_model_that_cannot_be_estimated_is_named_with_its_deployment(api, tmp_path, settings):
    settings.MODEL_ROOTS = [str(tmp_path)]
    r = api.post("/api/v1/plan", {"gpus": [], "deployments": [{"name": "m", "model": "ghost"}]})
    assert r.status_code == 422 and "deployments[0].model 'ghost': no model named 'ghost'" in refusal(r)
    r = api.post("/api/v1/plan", {"gpus": [], "deployments": [{"name": "m", "model": "/etc"}]})
    assert r.status_code == 422 and refusal(r).startswith("deployments[0].model '/etc': ")


def test_the_command_sizes_a_model_directory_relative_to_the_shell(tmp_path, model_dir, capsys, monkeypatch,
                                                                   settings):
    settings.MODEL_ROOTS = [str(model_dir.parent)]
    monkeypatch.chdir(model_dir.parent)
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"gpus": [{"id": "a/0", "total_bytes": 24 * GiB}],
                                "deployments": [{"name": "m", "model": f"./{model_dir.name}"}]}))
    call_command("plan", str(path), "--json")
    body = json.loads(capsys.readouterr().out)
    assert body["replicas"][0]["state"] == "ready" and body["replicas"][0]["reserved_bytes"] > 0
