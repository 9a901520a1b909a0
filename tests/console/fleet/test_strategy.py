"""The placement strategy, changed at run time from the API and the dashboard: the next pass plans with it."""

import pytest
from django.test import override_settings

from console.control.reconcile import reconcile_once
from console.deployments.models import Replica
from console.events.models import Event
from console.fleet.models import Gpu, Host
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db
GiB = 1024**3


@pytest.fixture
def one_host(db):
    h = Host.objects.create(name="h1", endpoint="http://127.0.0.1:9", connected=True)
    for i in range(2):
        Gpu.objects.create(host=h, index=i, uuid=f"h1-{i}", name="sim", total_bytes=24 * GiB, simulated=True)
    return h


@override_settings(MODELGRID_STRATEGY="balance")
def test_until_it_is_set_the_setting_holds(admin_api):
    assert admin_api.get("/api/v1/scheduler").json() == {
        "strategy": "balance", "set_at_run_time": False,
        "strategies": ["fill-first", "balance", "memory-optimized", "latency-sensitive"]}


def test_a_new_strategy_is_what_the_next_pass_places_with(admin_api, one_host, model_dir):
    admin_api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)})
    r = admin_api.patch("/api/v1/scheduler", {"strategy": "fill-first"})
    assert r.status_code == 200 and r.json()["strategy"] == "fill-first" and r.json()["set_at_run_time"]
    admin_api.post("/api/v1/deployments", {"name": "a", "model": "tiny", "spread": "none", "replicas": 2})
    reconcile_once()
    reasons = [r.reason for r in Replica.objects.filter(deployment__name="a")]
    assert all(reason.startswith("fill first") for reason in reasons), reasons
    assert Event.objects.filter(reason="StrategyChanged").get().message.endswith("→ fill-first")


def test_an_unknown_strategy_is_refused_and_changes_nothing(admin_api):
    r = admin_api.patch("/api/v1/scheduler", {"strategy": "densest"})
    assert r.status_code == 422 and refused_fields(r) == ["strategy"]
    assert refusal(r) == ("strategy must be one of fill-first, balance, memory-optimized, latency-sensitive, got "
                          "'densest'")
    assert admin_api.get("/api/v1/scheduler").json()["set_at_run_time"] is False


def test_the_dashboard_changes_the_strategy(admin_client):
    r = admin_client.post("/scheduler/strategy/", {"strategy": "balance"}, follow=True)
    html = r.content.decode()
    assert "Placement strategy: balance, from the scheduler&#x27;s next pass" in html
    assert '<option value="balance" title=' in html and "set here" in html
    r = admin_client.post("/scheduler/strategy/", {"strategy": "densest"}, follow=True)
    assert "Strategy not changed: strategy must be one of" in r.content.decode()


def test_only_admins_change_the_strategy_by_api_or_page(api, user_client):
    r = api.patch("/api/v1/scheduler", {"strategy": "fill-first"})
    assert r.status_code == 403 and "only staff users may change the placement strategy" in r.json()["detail"][0]["msg"]
    page = user_client.post("/scheduler/strategy/", {"strategy": "balance"}, follow=True)
    assert "only staff users may change the placement strategy" in page.content.decode()
    assert 'action="/scheduler/strategy/"' not in page.content.decode()  # a member is shown no form to try
    assert api.get("/api/v1/scheduler").json()["set_at_run_time"] is False
