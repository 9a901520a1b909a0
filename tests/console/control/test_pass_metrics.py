"""What a scheduler pass tells the metrics: replicas that became refused a place or were preempted, by tier."""

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from console.control.loop import run_pass
from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment
from console.gateway.metrics import METRICS
from tests.console.control.test_demand_reconcile import settled
from tests.console.control.test_reconcile import sized

pytestmark = pytest.mark.django_db


def test_a_preemption_is_counted_once_by_the_preempted_tier_then_its_refusal_once(host, model):
    sized("cheap", 20, priority="batch")
    assert reconcile_once().preempted == ()
    sized("vital", 20, priority="critical")
    first = reconcile_once()
    assert first.preempted == ("batch",)
    passes = [reconcile_once() for _ in range(3)]
    # Preempted without room to sleep, it now waits for a place: one refusal, however many passes it waits.
    assert [t for p in [first, *passes] for t in p.refused] == ["batch"]
    assert all(p.preempted == () for p in passes)


def test_a_replica_that_fits_nowhere_is_refused_once_per_replica(host, model):
    sized("huge", 100, min_replicas=2, max_replicas=2, priority="high")
    assert reconcile_once().refused == ("high", "high")
    assert reconcile_once().refused == ()


def test_scaling_to_zero_is_no_refusal(host, model):
    sized("rare", 5, min_replicas=0, max_replicas=1, idle_timeout_s=30)
    reconcile_once()
    settled()
    Deployment.objects.update(created=timezone.now() - timedelta(minutes=5),
                              last_request_at=timezone.now() - timedelta(minutes=2))
    passes = [reconcile_once() for _ in range(3)]
    assert "refuse" in {a for p in passes for a in p.actions}  # the scheduler's word for an unplaced replica
    assert [t for p in passes for t in p.refused] == []


def value(name: str, **labels) -> float:
    return METRICS.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.django_db(transaction=True)
async def test_a_pass_adds_its_refusals_and_preemptions_to_the_counters(host, model):
    await database_sync_to_async(sized)("cheap", 20, priority="batch")
    await run_pass()
    before = (value("modelgrid_scheduler_preemptions_total", tier="batch"),
              value("modelgrid_scheduler_placements_refused_total", tier="batch"))
    await database_sync_to_async(sized)("vital", 20, priority="critical")
    await run_pass()
    await run_pass()
    after = (value("modelgrid_scheduler_preemptions_total", tier="batch"),
             value("modelgrid_scheduler_placements_refused_total", tier="batch"))
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
