"""Demand from the gateway through the control loop: the database fields the gateway writes become the
scheduler's input, and its answer (served, waiting, refused) lands where the gateway reads it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from tests.console.control.test_reconcile import sized

pytestmark = pytest.mark.django_db
GiB = 1024**3


def waiting(name: str, n: int = 1, ago: float = 0.0) -> None:
    """What a gateway writes while `n` requests wait for a replica of `name`."""
    Deployment.objects.filter(name=name).update(demand=n, demand_at=timezone.now() - timedelta(seconds=ago))


def settled(rows_ago: float = 60.0) -> None:
    """Every replica placed and used long ago: past its residency and idle."""
    long_ago = timezone.now() - timedelta(seconds=rows_ago)
    Replica.objects.update(ready_since=long_ago, last_request_at=long_ago, observed_state="ready")


def test_demand_for_a_model_that_lost_its_gpu_puts_an_idle_equal_tier_one_to_sleep(host, model):
    host.ram_free_bytes = 64 * GiB
    host.save()
    for name in ("left", "right"):
        sized(name, 20, min_replicas=0, max_replicas=1)
    reconcile_once()
    placed = {r.deployment.name for r in Replica.objects.filter(host__isnull=False)}
    assert len(placed) == 1  # one 24 GiB GPU holds one of them
    (holder,), other = placed, ({"left", "right"} - placed).pop()
    settled()
    waiting(other, 3)
    reconcile_once()
    now_ready = Replica.objects.get(deployment__name=other)
    victim = Replica.objects.get(deployment__name=holder)
    assert now_ready.host == host and now_ready.desired_state == "ready"
    assert now_ready.ready_since is not None and timezone.now() - now_ready.ready_since < timedelta(seconds=30)
    assert victim.desired_state == "sleeping" and f"{other}#0" in victim.reason
    dep = Deployment.objects.get(name=other)
    assert dep.demand_status == "served"


def test_a_busy_occupant_makes_the_demand_wait_and_nothing_moves(host, model):
    host.ram_free_bytes = 64 * GiB
    host.save()
    for name in ("left", "right"):
        sized(name, 20, min_replicas=0, max_replicas=1)
    reconcile_once()
    holder = Replica.objects.get(host__isnull=False)
    other = "right" if holder.deployment.name == "left" else "left"
    settled()
    Replica.objects.filter(pk=holder.pk).update(last_request_at=timezone.now())  # serving right now
    waiting(other)
    reconcile_once()
    holder.refresh_from_db()
    assert holder.desired_state == "ready" and holder.host == host
    dep = Deployment.objects.get(name=other)
    assert dep.demand_status == "waiting" and holder.deployment.name in dep.demand_reason


def test_demand_that_can_never_be_served_is_refused_with_the_reason(host, model):
    sized("huge", 100, min_replicas=0, max_replicas=1)
    waiting("huge")
    reconcile_once()
    dep = Deployment.objects.get(name="huge")
    assert dep.demand_status == "refused" and "100.00 GiB" in dep.demand_reason


def test_demand_its_gateway_stopped_renewing_is_ignored(host, model):
    sized("huge", 100, min_replicas=0, max_replicas=1)
    waiting("huge", ago=60)  # that console process is gone
    reconcile_once()
    # No answer to requests (none wait); what remains is the outlook: a request would be refused.
    assert Deployment.objects.get(name="huge").demand_status == "blocked"


def test_an_answer_is_cleared_once_nothing_waits(host, model):
    sized("huge", 100, min_replicas=0, max_replicas=1)
    waiting("huge")
    reconcile_once()
    assert Deployment.objects.get(name="huge").demand_status == "refused"
    Deployment.objects.filter(name="huge").update(demand=0)
    reconcile_once()
    dep = Deployment.objects.get(name="huge")
    # Not an answer to requests any more: the outlook of the next one.
    assert dep.demand_status == "blocked" and "no GPU can ever hold it" in dep.demand_reason


def test_an_idle_scale_to_zero_deployment_leaves_its_gpu_and_says_so(host, model):
    sized("rare", 5, min_replicas=0, max_replicas=1, idle_timeout_s=30)
    reconcile_once()
    assert Replica.objects.get().host == host
    settled()
    Deployment.objects.update(created=timezone.now() - timedelta(minutes=5),
                              last_request_at=timezone.now() - timedelta(minutes=2))
    reconcile_once()
    replica = Replica.objects.get()
    assert replica.host is None  # the host reports no RAM for sleeping replicas: stopped
    assert "scaled to zero" in replica.reason and "idle_timeout_s 30" in replica.reason
    dep = Deployment.objects.get()
    assert dep.state == "idle" and "scaled to zero" in dep.reason
    waiting("rare")  # the next request brings it back
    reconcile_once()
    replica.refresh_from_db()
    assert replica.host == host and replica.desired_state == "ready"


def test_the_longest_waiting_demand_gets_the_gpu_first(host, model):
    host.ram_free_bytes = 64 * GiB
    host.save()
    for name in ("alpha", "holder", "zeta"):
        sized(name, 20, min_replicas=0, max_replicas=1)
    reconcile_once()
    assert Replica.objects.get(host__isnull=False).deployment.name == "alpha"  # the GPU holds one of them
    settled()
    now = timezone.now()
    Deployment.objects.filter(name="zeta").update(demand=1, demand_at=now, demand_since=now - timedelta(seconds=20))
    Deployment.objects.filter(name="holder").update(demand=1, demand_at=now, demand_since=now - timedelta(seconds=2))
    reconcile_once()
    assert Deployment.objects.get(name="zeta").demand_status == "served"  # not "holder", first by name
    assert Deployment.objects.get(name="holder").demand_status == "waiting"


def test_requests_waiting_on_a_replica_that_keeps_failing_are_told_its_failure_not_that_it_is_ready(host, model):
    # issue 45: a model whose weights the worker could not load crash-looped, and clients waited 60 s for a 503
    # that said "ready on local/0".
    sized("chat", 5)
    reconcile_once()
    Replica.objects.update(observed_state="failed", observed_reason="size mismatch for model.embed_tokens.weight")
    waiting("chat")
    reconcile_once()
    dep = Deployment.objects.get(name="chat")
    assert "ready on" not in dep.demand_reason, dep.demand_reason
    assert dep.demand_reason == (f"its replica chat#0 on {host.name} failed: size mismatch for "
                                 "model.embed_tokens.weight (its agent restarts it)")
    Replica.objects.update(observed_state="loading", observed_reason="")  # started again
    reconcile_once()
    assert Deployment.objects.get(name="chat").demand_reason == f"its replica chat#0 on {host.name} is loading"
    Replica.objects.update(observed_state="ready")
    reconcile_once()
    # Requests still waiting once a replica is ready are backed up behind it (issue 48): it is at its maximum.
    assert Deployment.objects.get(name="chat").demand_reason == ("backed up behind 1 ready replica, but it is at its "
                                                                 "maximum of 1 replica")


def test_requests_backed_up_behind_a_ready_critical_replica_put_a_batch_one_to_sleep_for_another(host, model):
    host.ram_free_bytes = 64 * GiB
    host.save()
    sized("vital", 10, priority="critical", min_replicas=1, max_replicas=2)
    sized("crawl", 10, priority="batch", min_replicas=0, max_replicas=1)
    reconcile_once()
    assert Replica.objects.filter(host__isnull=False).count() == 2  # both on the 24 GiB GPU, no room for a third
    settled()  # vital#0 is ready at the gateway: the requests are backed up behind it
    waiting("vital", 12)
    reconcile_once()
    dep = Deployment.objects.get(name="vital")
    assert dep.replicas == 2 and dep.demand_status == "served"
    assert dep.demand_reason == "backed up behind 1 ready replica: adding vital#1, placed on h1/0"
    added = Replica.objects.get(deployment__name="vital", index=1)
    assert added.host == host and added.desired_state == "ready"
    victim = Replica.objects.get(deployment__name="crawl")
    assert victim.desired_state == "sleeping" and victim.action == "preempt" and "vital#1" in victim.reason


def test_requests_waiting_on_a_replica_not_ready_yet_add_none(host, model):
    sized("vital", 10, priority="critical", min_replicas=1, max_replicas=2)
    reconcile_once()
    Replica.objects.update(observed_state="loading")  # placed, not ready at the gateway: nothing is backed up
    waiting("vital", 12)
    reconcile_once()
    assert Deployment.objects.get(name="vital").replicas == 1
    assert Replica.objects.filter(deployment__name="vital").count() == 1
