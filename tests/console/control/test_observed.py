"""Host reports of how deployments were served become the scheduler's SLO input."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.protocol import DeploymentServing, HostReport
from console.control.observed import refresh_observations
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.fleet.models import Host
from console.intake.stages import apply_one

pytestmark = pytest.mark.django_db


def report(*serving, ram=None):
    return HostReport(gpus=[], serving=[DeploymentServing(deployment=d, requests=10, request_rate=r, error_rate=0,
                                                          p95_ms=p) for d, r, p in serving], ram_free_bytes=ram)


def on(host, dep, index=0):
    """A replica of `dep` on `host`: an agent's figures count only for what it runs."""
    Replica.objects.create(deployment=Deployment.objects.get(name=dep), index=index, host=host)


def test_rates_add_up_across_hosts_and_the_worst_p95_counts(host, model):
    create_deployment("chat", "tiny", slo_latency_ms=100)
    other = Host.objects.create(name="h2", connected=True)
    on(host, "chat", 0)
    on(other, "chat", 1)
    apply_one(host, report(("chat", 2.0, 80.0), ram=1 << 30))
    apply_one(other, report(("chat", 3.0, 120.0)))
    assert refresh_observations(timezone.now())  # it started violating: a change the loop acts on
    dep = Deployment.objects.get()
    assert (dep.traffic_rps, dep.observed_p95_ms, dep.violating) == (5.0, 120.0, True)
    assert Host.objects.get(name="h1").ram_free_bytes == 1 << 30


def test_the_status_clock_restarts_only_when_the_slo_status_flips(host, model):
    create_deployment("chat", "tiny", slo_latency_ms=100)
    on(host, "chat")
    t0 = timezone.now()
    apply_one(host, report(("chat", 1.0, 50.0)))
    refresh_observations(t0)
    apply_one(host, report(("chat", 4.0, 60.0)))
    assert not refresh_observations(t0 + timedelta(seconds=30))  # still within the SLO
    dep = Deployment.objects.get()
    assert dep.status_since == t0 and dep.traffic_rps == 4.0 and not dep.violating
    apply_one(host, report(("chat", 4.0, 150.0)))
    later = t0 + timedelta(seconds=60)
    assert refresh_observations(later)
    dep.refresh_from_db()
    assert dep.violating and dep.status_since == later


def test_a_deployment_without_an_slo_never_violates(host, model):
    create_deployment("bulk", "tiny")
    on(host, "bulk")
    apply_one(host, report(("bulk", 1.0, 5000.0)))
    refresh_observations(timezone.now())
    assert not Deployment.objects.get().violating


def test_hosts_that_went_offline_no_longer_count(host, model):
    create_deployment("chat", "tiny")
    on(host, "chat")
    apply_one(host, report(("chat", 2.0, 10.0)))
    Host.objects.filter(pk=host.pk).update(connected=False)
    refresh_observations(timezone.now())
    assert Deployment.objects.get().traffic_rps == 0.0


def test_a_deployment_violating_its_slo_gets_more_replicas_from_the_loop(host, model):
    from console.control.reconcile import reconcile_once
    from console.deployments.models import Replica

    create_deployment("chat", "tiny", min_replicas=1, max_replicas=3, slo_latency_ms=100)
    reconcile_once()
    assert Deployment.objects.get().replicas == 1
    apply_one(host, report(("chat", 20.0, 250.0)))
    reconcile_once()
    dep = Deployment.objects.get()
    assert dep.violating and dep.replicas == 3 and dep.last_scale_at is not None
    assert Replica.objects.filter(deployment=dep, host__isnull=False).count() == 3
    extra = Replica.objects.get(deployment=dep, index=2)
    assert "SLO" in extra.reason


def test_an_agent_cannot_report_figures_for_a_deployment_it_does_not_run(host, model):
    create_deployment("emb", "tiny", slo_latency_ms=100)
    apply_one(host, report(("emb", 50.0, 1e7)))  # no replica of emb on h1
    refresh_observations(timezone.now())
    dep = Deployment.objects.get()
    assert (dep.traffic_rps, dep.observed_p95_ms, dep.violating) == (0.0, None, False)


def test_what_the_gateway_saw_comes_before_agents_reports(host, model):
    create_deployment("chat", "tiny", slo_latency_ms=100)
    on(host, "chat")
    apply_one(host, report(("chat", 2.0, 10.0)))  # the agent's own view: fast
    now = timezone.now()
    fresh = {"request_rate": 3.0, "p95_ms": 250.0, "at": now.timestamp()}  # clients saw queueing too
    gone = {"request_rate": 9.0, "p95_ms": 900.0, "at": now.timestamp() - 60}  # a console process that stopped
    Deployment.objects.update(gateway_stats={"console-a:1": fresh, "console-b:2": gone})
    refresh_observations(now)
    dep = Deployment.objects.get()
    assert (dep.traffic_rps, dep.observed_p95_ms, dep.violating) == (3.0, 250.0, True)
