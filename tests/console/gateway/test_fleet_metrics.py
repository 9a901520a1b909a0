"""The console's /metrics: the fleet's figures follow the database from one scrape to the next, and the whole body
parses as Prometheus text."""

from __future__ import annotations

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment, delete_deployment
from console.fleet.models import Host
from console.gateway.app import make_app
from console.gateway.core import Gateway, GatewaySettings
from console.gateway.fleet_metrics import FleetCollector, scrape
from console.gateway.metrics import ConsoleMetrics

pytestmark = pytest.mark.django_db


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape by (name, labels); parsing it at all is the first check."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def read() -> dict[tuple[str, frozenset], float]:
    return samples(scrape(ConsoleMetrics()).decode())


def at(found: dict, name: str, **labels) -> float | None:
    return found.get((name, frozenset(labels.items())))


def names(found: dict, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for n, labels in found if n == name}


def test_hosts_are_counted_by_lifecycle_and_a_disconnect_moves_one_to_unknown():
    now = timezone.now()
    Host.objects.create(name="up", connected=True)
    Host.objects.create(name="lapsed", connected=False, unknown_since=now)
    Host.objects.create(name="evicted", connected=False, unknown_since=now, evicted_at=now)
    found = read()
    assert [at(found, "modelgrid_hosts", state=s) for s in ("connected", "unknown", "offline")] == [1, 1, 1]
    assert at(found, "modelgrid_host_lifecycle", host="lapsed", state="unknown") == 1
    assert at(found, "modelgrid_host_lifecycle", host="lapsed", state="connected") == 0

    Host.objects.filter(name="up").update(connected=False, unknown_since=now)
    found = read()
    assert [at(found, "modelgrid_hosts", state=s) for s in ("connected", "unknown", "offline")] == [0, 2, 1]
    assert at(found, "modelgrid_host_lifecycle", host="up", state="unknown") == 1

    Host.objects.filter(name="evicted").delete()
    found = read()
    assert at(found, "modelgrid_hosts", state="offline") == 0
    assert "evicted" not in names(found, "modelgrid_host_lifecycle", "host")


def test_generations_behind_sum_over_connected_hosts_only():
    Host.objects.create(name="a", connected=True, generation=7, acked_generation=4)
    Host.objects.create(name="b", connected=True, generation=2, acked_generation=1)
    Host.objects.create(name="c", connected=True, generation=5, acked_generation=5)
    # A host that is away cannot acknowledge anything: it is not "behind", it is unknown.
    Host.objects.create(name="d", connected=False, unknown_since=timezone.now(), generation=9, acked_generation=1)
    found = read()
    assert at(found, "modelgrid_desired_state_generations_behind") == 4
    assert at(found, "modelgrid_desired_state_hosts_behind") == 2

    Host.objects.filter(name="a").update(acked_generation=7)
    found = read()
    assert at(found, "modelgrid_desired_state_generations_behind") == 1
    assert at(found, "modelgrid_desired_state_hosts_behind") == 1


def test_per_deployment_slo_series_follow_the_database_and_leave_with_the_deployment(model):
    create_deployment("chat", "tiny", slo_latency_ms=200, priority="critical")
    create_deployment("batchy", "tiny", priority="batch")
    Deployment.objects.filter(name="chat").update(observed_p95_ms=250.0, violating=True)
    chat = Deployment.objects.get(name="chat")
    Replica.objects.create(deployment=chat, index=0, observed_state="ready")
    Replica.objects.create(deployment=chat, index=1, observed_state="ready")
    Replica.objects.create(deployment=chat, index=2, observed_state="failed")
    found = read()
    assert at(found, "modelgrid_deployment_slo_latency_seconds", deployment="chat") == 0.2
    assert at(found, "modelgrid_deployment_slo_objective_ratio", deployment="chat") == 0.95
    assert at(found, "modelgrid_deployment_slo_violating", deployment="chat") == 1
    assert at(found, "modelgrid_deployment_observed_p95_seconds", deployment="chat") == 0.25
    assert at(found, "modelgrid_deployment_replicas", deployment="chat", state="ready") == 2
    assert at(found, "modelgrid_deployment_replicas", deployment="chat", state="failed") == 1
    assert at(found, "modelgrid_deployment_info", deployment="batchy", tier="batch", state="pending") == 1
    # Without a target there is no SLO to meet or violate.
    assert "batchy" not in names(found, "modelgrid_deployment_slo_violating", "deployment")

    Deployment.objects.filter(name="chat").update(observed_p95_ms=120.0, violating=False)
    found = read()
    assert at(found, "modelgrid_deployment_slo_violating", deployment="chat") == 0
    assert at(found, "modelgrid_deployment_observed_p95_seconds", deployment="chat") == 0.12

    delete_deployment("chat")
    found = read()
    gone = [n for n, labels in found if ("deployment", "chat") in labels]
    assert gone == []
    assert names(found, "modelgrid_deployment_info", "deployment") == {"batchy"}


def test_without_the_database_the_process_still_shows_its_own_series():
    metrics = ConsoleMetrics()
    metrics.actions.labels("place").inc()
    found = samples(metrics.render(FleetCollector(None)).decode())
    assert at(found, "modelgrid_console_database_up") == 0
    assert at(found, "modelgrid_scheduler_actions_total", action="place") == 1
    assert not [n for n, _ in found if n.startswith("modelgrid_hosts")]


@pytest.mark.django_db(transaction=True)
async def test_the_endpoint_serves_the_fleet_with_the_processs_own_series(api_token):
    await sync_to_async(Host.objects.create)(name="h1", connected=True)
    metrics = ConsoleMetrics()
    metrics.refused.labels("critical").inc()
    gateway = Gateway(GatewaySettings(), metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(make_app(gateway)), base_url="http://gw",
                                 headers={"Authorization": f"Bearer {api_token}"}, timeout=10) as client:
        r = await client.get("/metrics")
    await gateway.close()
    found = samples(r.text)
    assert at(found, "modelgrid_console_database_up") == 1
    assert at(found, "modelgrid_hosts", state="connected") == 1
    assert at(found, "modelgrid_scheduler_placements_refused_total", tier="critical") == 1
