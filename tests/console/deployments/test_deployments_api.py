import pytest

from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db


@pytest.fixture
def registered(api, model_dir):
    assert api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)}).status_code == 201


def test_it_creates_a_deployment_that_waits_for_placement(api, registered):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "replicas": 2})
    assert r.status_code == 201, r.content
    assert r.json()["state"] == "pending"
    reconcile_once()
    body = api.get("/api/v1/deployments/chat").json()
    assert body["replica_count"] == 2
    assert [rep["state"] for rep in body["replicas"]] == ["pending", "pending"]
    assert all(rep["host"] is None and rep["endpoint"] is None for rep in body["replicas"])


def test_a_deployment_with_no_gpus_anywhere_is_unschedulable_with_a_reason(api, registered):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny"})
    reconcile_once()
    body = api.get("/api/v1/deployments/chat").json()
    assert body["state"] == "unschedulable"
    assert "no GPU is available" in body["reason"]
    assert "no GPU is available" in body["replicas"][0]["reason"]


def test_it_refuses_an_unknown_model_and_stores_nothing(api):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "ghost"})
    assert r.status_code == 422
    assert "no model named 'ghost'" in refusal(r)
    assert not Deployment.objects.exists()


def test_it_refuses_a_negative_replica_count(api, registered):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "replicas": -1})
    assert r.status_code == 422
    assert not Deployment.objects.exists()


def test_it_deletes_a_deployment(api, registered):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny"})
    assert api.delete("/api/v1/deployments/chat").status_code == 204
    r = api.get("/api/v1/deployments/chat")
    assert r.status_code == 404
    assert refusal(r) == "no deployment named 'chat'"


def test_it_scales_a_deployment_up_and_down(api, registered, client):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "replicas": 1})
    reconcile_once()
    patch = {"HTTP_AUTHORIZATION": api.auth["HTTP_AUTHORIZATION"], "content_type": "application/json"}
    r = client.patch("/api/v1/deployments/chat", data='{"replicas": 3}', **patch)
    assert r.status_code == 200 and r.json()["replica_count"] == 3
    reconcile_once()
    assert [rep["index"] for rep in api.get("/api/v1/deployments/chat").json()["replicas"]] == [0, 1, 2]
    assert client.patch("/api/v1/deployments/chat", data='{"replicas": 65}', **patch).status_code == 422
    client.patch("/api/v1/deployments/chat", data='{"replicas": 1}', **patch)
    reconcile_once()
    assert [rep["index"] for rep in api.get("/api/v1/deployments/chat").json()["replicas"]] == [0]
    assert client.patch("/api/v1/deployments/ghost", data='{"replicas": 1}', **patch).status_code == 404


def test_it_changes_the_policy_and_refuses_a_bad_change_whole(api, registered, client):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "min_replicas": 1, "max_replicas": 4,
                                     "priority": "high", "slo_latency_ms": 200, "selector": {"gpu": "h100"}})
    patch = {"HTTP_AUTHORIZATION": api.auth["HTTP_AUTHORIZATION"], "content_type": "application/json"}
    r = client.patch("/api/v1/deployments/chat", data='{"priority": "critical", "max_batch_size": 16, '
                     '"max_batch_delay_ms": 2.5, "latency_critical": true}', **patch)
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["priority"], body["max_batch_size"], body["max_batch_delay_ms"]) == ("critical", 16, 2.5)
    assert (body["min_replicas"], body["max_replicas"], body["selector"]) == (1, 4, {"gpu": "h100"})
    r = client.patch("/api/v1/deployments/chat", data='{"priority": "low", "max_batch_size": 2}', **patch)
    assert r.status_code == 422 and refused_fields(r) == ["priority"]
    assert refusal(r) == "input should be 'critical', 'high', 'standard' or 'batch'"
    assert Deployment.objects.get().max_batch_size == 16  # nothing of the refused change was stored
    r = client.patch("/api/v1/deployments/chat", data='{"min_replicas": 5}', **patch)
    assert r.status_code == 422 and refusal(r) == "max_replicas 4 is below min_replicas 5"
    assert refused_fields(r) == ["max_replicas"]


@pytest.mark.parametrize("name", ["ghost\n", "ghost\r\n", "\nghost"])
def test_it_refuses_a_name_that_could_not_be_reached_again_and_stores_nothing(api, registered, name):
    r = api.post("/api/v1/deployments", {"name": name, "model": "tiny"})
    assert r.status_code == 422, r.content
    assert refused_fields(r) == ["name"]
    assert f"deployment name {name!r} is not valid" in refusal(r)
    assert not Deployment.objects.exists()


# A JSON value of another type than the schema says is refused, never coerced ("yes" is not true, 1 is not
# true, "3" is not 3, 2.0 is not 2).
WRONG_TYPES = [("standby", "yes"), ("standby", 1), ("latency_critical", "true"), ("replicas", "3"),
               ("replicas", 2.0), ("max_batch_size", "16"), ("max_batch_delay_ms", "5"), ("slo_latency_ms", True),
               ("idle_timeout_s", "300"), ("priority", 1), ("selector", {"gpu": 1})]


@pytest.mark.parametrize("field, value", WRONG_TYPES)
def test_it_refuses_a_value_of_the_wrong_json_type_and_stores_nothing(api, registered, field, value):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", field: value})
    assert r.status_code == 422, r.content
    assert refused_fields(r) == [field]
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("field, value", [("batch", "3"), ("batch", True), ("seq", "128"), ("dtype", 16),
                                          ("model", 1)])
def test_it_refuses_serving_settings_of_the_wrong_json_type(api, registered, field, value):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", field: value})
    assert r.status_code == 422, r.content
    assert refused_fields(r) == [field]
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("field, value", WRONG_TYPES)
def test_a_change_of_the_wrong_json_type_is_refused_and_changes_nothing(api, registered, field, value):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny"})
    before = api.get("/api/v1/deployments/chat").json()
    r = api.patch("/api/v1/deployments/chat", {field: value})
    assert r.status_code == 422, r.content
    assert refused_fields(r) == [field]
    assert api.get("/api/v1/deployments/chat").json() == before


def test_a_whole_number_is_still_a_float(api, registered):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "max_batch_delay_ms": 5})
    assert r.status_code == 201 and r.json()["max_batch_delay_ms"] == 5.0
