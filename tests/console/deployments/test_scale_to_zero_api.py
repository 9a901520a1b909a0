"""Scale to zero through the REST API: min_replicas 0 with an idle timeout, and what a deployment reports
of how it serves (the serving word, requests waiting at the gateway and the scheduler's answer)."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment, update_deployment
from console.errors import Invalid
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db


@pytest.fixture
def registered(api, model_dir):
    assert api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)}).status_code == 201


@pytest.fixture
def patch(client, api):
    def send(name: str, body: dict):
        return client.patch(f"/api/v1/deployments/{name}", data=json.dumps(body), content_type="application/json",
                            **api.auth)
    return send


def test_min_0_max_1_starts_with_one_replica_that_may_scale_to_zero(api, registered):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "min_replicas": 0, "max_replicas": 1})
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["replica_count"], body["min_replicas"], body["max_replicas"]) == (1, 0, 1)
    assert body["idle_timeout_s"] == 300


def test_the_idle_timeout_is_set_at_creation_and_changed_by_patch(api, registered, patch):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "min_replicas": 0, "max_replicas": 2,
                                         "idle_timeout_s": 60})
    assert r.status_code == 201 and r.json()["idle_timeout_s"] == 60
    r = patch("chat", {"idle_timeout_s": 900})
    assert r.status_code == 200 and r.json()["idle_timeout_s"] == 900
    assert Deployment.objects.get().idle_timeout_s == 900


@pytest.mark.parametrize("value", [0, 604_801, -5])
def test_an_idle_timeout_out_of_range_is_refused_whole_and_says_the_range(api, registered, patch, value):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "min_replicas": 0, "max_replicas": 1})
    r = patch("chat", {"idle_timeout_s": value, "priority": "critical"})
    assert r.status_code == 422
    bound = "greater than or equal to 1" if value < 1 else "less than or equal to 604800"
    assert refusal(r) == f"input should be {bound}" and refused_fields(r) == ["idle_timeout_s"]
    dep = Deployment.objects.get()
    assert (dep.idle_timeout_s, dep.priority) == (300, "standard")


def test_a_create_with_a_bad_idle_timeout_stores_nothing(api, registered):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "idle_timeout_s": 0})
    assert r.status_code == 422 and refused_fields(r) == ["idle_timeout_s"]
    assert "greater than or equal to 1" in refusal(r)
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("value", [True, 1.5, "300", None])
def test_the_service_takes_only_a_whole_number_of_seconds(model, value):
    create_deployment("chat", "tiny")
    with pytest.raises(Invalid, match="^idle_timeout_s: input should be a valid integer"):
        update_deployment("chat", {"idle_timeout_s": value})


def test_a_deployment_reports_how_it_serves_and_when_it_was_last_asked(api, registered, host):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "min_replicas": 0, "max_replicas": 2})
    dep = Deployment.objects.get()
    assert api.get("/api/v1/deployments/chat").json()["serving"] == "cold"  # no replica anywhere yet
    asked = timezone.now() - timedelta(minutes=2)
    Replica.objects.create(deployment=dep, index=0, host=host, desired_state="sleeping", observed_state="sleeping",
                           last_request_at=asked)
    body = api.get("/api/v1/deployments/chat").json()
    assert body["serving"] == "asleep"
    assert body["replicas"][0]["last_request_at"] is not None
    Replica.objects.filter(index=0).update(desired_state="ready")
    assert api.get("/api/v1/deployments/chat").json()["serving"] == "waking"
    Replica.objects.filter(index=0).update(observed_state="ready")
    Deployment.objects.update(last_request_at=asked)
    body = api.get("/api/v1/deployments/chat").json()
    assert body["serving"] == "ready" and body["last_request_at"].startswith(asked.strftime("%Y-%m-%dT%H:%M"))
    Deployment.objects.update(standby=True)
    assert api.get("/api/v1/deployments/chat").json()["serving"] == "standby"


def test_waiting_requests_and_the_schedulers_answer_are_reported_until_the_count_goes_stale(api, registered):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "min_replicas": 0, "max_replicas": 1})
    body = api.get("/api/v1/deployments/chat").json()
    assert (body["demand"], body["demand_status"], body["demand_reason"]) == (0, "", "")
    reason = "waiting for std#0 to go idle (it served a request 4 s ago)"
    Deployment.objects.update(demand=2, demand_at=timezone.now(), demand_status="waiting", demand_reason=reason)
    body = api.get("/api/v1/deployments/chat").json()
    assert (body["demand"], body["demand_status"], body["demand_reason"]) == (2, "waiting", reason)
    # A gateway that stopped renewing its count (it crashed, or the requests gave up) leaves no demand.
    Deployment.objects.update(demand_at=timezone.now() - timedelta(minutes=1))
    assert api.get("/api/v1/deployments/chat").json()["demand"] == 0
