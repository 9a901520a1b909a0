"""POST /api/v1/deployments/bulk: many deployments in one request, all or none, each refusal located at its
item; one estimate per model and shape, one scheduler wake."""

import pytest

from console.catalog import memory
from console.deployments import services
from console.deployments.models import Deployment
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
BULK = "/api/v1/deployments/bulk"


@pytest.fixture
def registered(api, model_dir):
    assert api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)}).status_code == 201


def locs(response) -> list[list]:
    return [e["loc"] for e in response.json()["detail"]]


def test_it_creates_every_deployment_and_answers_them_in_request_order(api, registered):
    items = [{"name": "zeta", "model": "tiny", "replicas": 2, "priority": "critical"},
             {"name": "alpha", "model": "tiny", "min_replicas": 0, "max_replicas": 3, "dtype": "fp16"}]
    r = api.post(BULK, {"deployments": items})
    assert r.status_code == 201, r.content
    assert [(d["name"], d["replica_count"], d["min_replicas"], d["max_replicas"], d["priority"], d["dtype"])
            for d in r.json()] == [("zeta", 2, 2, 2, "critical", "float32"), ("alpha", 1, 0, 3, "standard", "float16")]
    assert r.json() == [api.get(f"/api/v1/deployments/{name}").json() for name in ("zeta", "alpha")]
    assert r.json()[0]["estimates"]["cuda"]["total_bytes"] > 0


def test_a_bulk_deployment_matches_one_created_alone(api, registered):
    api.post("/api/v1/deployments", {"name": "single", "model": "tiny", "replicas": 2, "seq": 64, "batch": 4})
    api.post(BULK, {"deployments": [{"name": "bulked", "model": "tiny", "replicas": 2, "seq": 64, "batch": 4}]})
    fields = [f.name for f in Deployment._meta.fields if f.name not in ("id", "name", "created")]
    single, bulked = (Deployment.objects.values(*fields).get(name=n) for n in ("single", "bulked"))
    assert single == bulked


def test_one_refused_item_refuses_the_request_and_stores_nothing(api, registered):
    items = [{"name": f"ok-{i}", "model": "tiny"} for i in range(5)]
    items[3] = {"name": "Bad Name", "model": "tiny"}
    r = api.post(BULK, {"deployments": items})
    assert r.status_code == 422
    assert locs(r) == [["body", "deployments", 3, "name"]]
    assert "deployment name 'Bad Name' is not valid" in refusal(r)
    assert not Deployment.objects.exists()


def test_every_refused_item_is_named_with_its_field(api, registered):
    items = [{"name": "a", "model": "ghost"},
             {"name": "b", "model": "tiny", "min_replicas": 3, "max_replicas": 1},
             {"name": "c", "model": "tiny"},
             {"name": "d", "model": "tiny", "seq": 1_000_000},
             {"name": "e", "model": "tiny", "dtype": "int4"}]
    r = api.post(BULK, {"deployments": items})
    assert r.status_code == 422
    assert locs(r) == [["body", "deployments", 0, "model"], ["body", "deployments", 1, "max_replicas"],
                       ["body", "deployments", 3, "seq"], ["body", "deployments", 4, "dtype"]]
    assert not Deployment.objects.exists()


def test_a_schema_refusal_names_the_item_too(api, registered):
    r = api.post(BULK, {"deployments": [{"name": "a", "model": "tiny"}, {"name": "b", "model": "tiny", "batch": 0}]})
    assert r.status_code == 422 and locs(r) == [["body", "deployments", 1, "batch"]]
    r = api.post(BULK, {"deployments": [{"name": "a", "model": "tiny", "replica": 2}]})
    assert r.status_code == 422 and locs(r) == [["body", "deployments", 0, "replica"]]


def test_a_name_given_twice_or_already_taken_is_a_conflict(api, registered):
    api.post("/api/v1/deployments", {"name": "taken", "model": "tiny"})
    r = api.post(BULK, {"deployments": [{"name": "twice", "model": "tiny"}, {"name": "taken", "model": "tiny"},
                                        {"name": "twice", "model": "tiny"}]})
    assert r.status_code == 422  # a duplicate within the request is the request's own fault
    assert locs(r) == [["body", "deployments", 1, "name"], ["body", "deployments", 2, "name"]]
    assert "a deployment named 'taken' already exists" in refusal(r)
    assert "name 'twice' is already given to deployment 0 of this request" in refusal(r)
    r = api.post(BULK, {"deployments": [{"name": "fresh", "model": "tiny"}, {"name": "taken", "model": "tiny"}]})
    assert r.status_code == 409 and locs(r) == [["body", "deployments", 1, "name"]]
    assert list(Deployment.objects.values_list("name", flat=True)) == ["taken"]


def test_a_name_another_request_took_after_the_checks_is_a_conflict_and_stores_nothing(api, registered,
                                                                                       monkeypatch):
    # The race the checks cannot see: the unique constraint refuses the insert (by COPY on PostgreSQL).
    api.post("/api/v1/deployments", {"name": "taken", "model": "tiny"})
    monkeypatch.setattr(services, "_taken_names", lambda names: {})
    r = api.post(BULK, {"deployments": [{"name": "fresh", "model": "tiny"}, {"name": "taken", "model": "tiny"}]})
    assert r.status_code == 409, r.content
    assert "another request created a deployment of the same name meanwhile" in refusal(r)
    assert list(Deployment.objects.values_list("name", flat=True)) == ["taken"]


@pytest.mark.parametrize("count", [0, 1001])
def test_it_takes_1_to_1000_deployments(api, registered, count):
    r = api.post(BULK, {"deployments": [{"name": f"d{i}", "model": "tiny"} for i in range(count)]})
    assert r.status_code == 422 and locs(r) == [["body", "deployments"]]


def test_one_estimate_per_model_and_shape_and_one_wake(api, registered, monkeypatch,
                                                     django_capture_on_commit_callbacks):
    estimates, wakes = [], []
    real = memory.settings_estimates
    monkeypatch.setattr(services, "settings_estimates", lambda *a, **k: estimates.append(a[1:]) or real(*a, **k))
    monkeypatch.setattr(services, "wake_scheduler", lambda: wakes.append(1))
    items = [{"name": f"d{i:03d}", "model": "tiny", "seq": 128 if i % 2 else None} for i in range(200)]
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post(BULK, {"deployments": items})
    assert r.status_code == 201 and len(r.json()) == 200
    assert sorted(estimates, key=str) == [("float32", 1, 128), ("float32", 1, None)]
    assert wakes == [1]
    assert Deployment.objects.count() == 200


def test_a_deployment_named_bulk_stays_reachable(api, registered, client):
    assert api.post("/api/v1/deployments", {"name": "bulk", "model": "tiny"}).status_code == 201
    assert api.get("/api/v1/deployments/bulk").json()["name"] == "bulk"
    r = client.patch("/api/v1/deployments/bulk", data='{"replicas": 2}', content_type="application/json",
                     **api.auth)
    assert r.status_code == 200 and r.json()["replica_count"] == 2
    assert api.delete("/api/v1/deployments/bulk").status_code == 204
    assert not Deployment.objects.exists()


def test_a_name_with_a_trailing_newline_is_refused_at_its_item(api, registered):
    r = api.post(BULK, {"deployments": [{"name": "fine", "model": "tiny"}, {"name": "ghost\n", "model": "tiny"}]})
    assert r.status_code == 422 and locs(r) == [["body", "deployments", 1, "name"]]
    assert "ends with a newline" in refusal(r)
    assert not Deployment.objects.exists()


def test_an_item_of_the_wrong_json_type_is_refused_at_its_item(api, registered):
    r = api.post(BULK, {"deployments": [{"name": "a", "model": "tiny"}, {"name": "b", "model": "tiny",
                                                                        "standby": "yes"}]})
    assert r.status_code == 422 and locs(r) == [["body", "deployments", 1, "standby"]]
    assert not Deployment.objects.exists()
