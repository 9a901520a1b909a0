"""What a deployment reads is what a request to it gets: one whose next request would be refused reads blocked, on
the API, the dashboard and the deployment page, before any request is refused."""

import pytest

from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment

pytestmark = pytest.mark.django_db


def test_a_deployment_no_gpu_matches_reads_blocked_not_cold(api, host, model, user_client):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "selector": {"gpu": "h100"}})
    assert r.status_code == 201, r.content
    reconcile_once()
    body = api.get("/api/v1/deployments/chat").json()
    assert body["state"] == "unschedulable" and body["serving"] == "blocked"
    assert body["demand_status"] == "blocked" and "excluded by label gpu=h100" in body["demand_reason"]
    assert body["demand"] == 0  # nobody waits: the outlook is the scheduler's, before any request
    html = user_client.get("/").content.decode()
    assert 'data-serving="blocked"' in html
    html = user_client.get("/deployments/chat/").content.decode()
    assert 'data-serving="blocked"' in html and "a request gets 503 with the scheduler" in html


def test_the_outlook_clears_once_the_deployment_can_be_served(api, host, model):
    api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "selector": {"gpu": "h100"}})
    reconcile_once()
    assert Deployment.objects.get(name="chat").demand_status == "blocked"
    api.patch("/api/v1/deployments/chat", {"selector": {}})
    reconcile_once()
    dep = Deployment.objects.get(name="chat")
    assert (dep.demand_status, dep.demand_reason) == ("", "")
    assert api.get("/api/v1/deployments/chat").json()["serving"] != "blocked"
