"""Hosts live by leases: a silent host is unknown and keeps its replicas; only after the eviction timeout,
at a bounded rate, are they re-placed; nothing lapses during the reconnect grace after a console starts."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.protocol import ReplicaStatus
from console.control import reconcile
from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.fleet.models import Gpu, Host
from console.intake.stages import Closed, Item, apply_batch, apply_one

pytestmark = pytest.mark.django_db
GiB = 1024**3


@pytest.fixture
def leading(settings):
    """A scheduler that has led for longer than the reconnect grace."""
    settings.MODELGRID_RECONNECT_GRACE_SECONDS = 0
    settings.MODELGRID_HOST_LEASE_SECONDS = 20
    settings.MODELGRID_EVICTION_SECONDS = 60
    reconcile.start_leading()
    return settings


def second_host(name="h2", total=24 * GiB) -> Host:
    h = Host.objects.create(name=name, endpoint="http://127.0.0.1:8", connected=True, last_seen=timezone.now())
    Gpu.objects.create(host=h, index=0, uuid=f"SIM-{name}", name="sim", total_bytes=total, simulated=True)
    return h


def silent_for(host: Host, seconds: float) -> None:
    Host.objects.filter(pk=host.pk).update(last_seen=timezone.now() - timedelta(seconds=seconds))


def placed_on(name: str) -> str | None:
    replica = Replica.objects.select_related("host").get(deployment__name=name)
    return replica.host.name if replica.host else None


def test_a_host_whose_lease_lapsed_is_unknown_and_keeps_its_replicas(leading, host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    second_host()
    silent_for(host, 30)  # past the lease (20 s) and a renewal interval (5 s)
    reconcile_once()
    host.refresh_from_db()
    assert host.lifecycle == "unknown" and host.unknown_since is not None
    assert placed_on("chat") == "h1"  # kept where it was, though h2 has room


def test_a_lease_lapses_a_lease_a_renewal_interval_and_a_lease_sweep_after_it_was_written(leading, host):
    # The agent may have spoken up to a renewal interval (5 s) and a lease sweep (1 s) after last_seen, its message
    # waiting for the batcher's next sweep (intake.LeaseChecks): a host lapses no sooner than that after it.
    silent_for(host, 25.8)
    reconcile_once()
    host.refresh_from_db()
    assert host.lifecycle == "connected"
    silent_for(host, 26.2)
    reconcile_once()
    host.refresh_from_db()
    assert host.lifecycle == "unknown"


def test_an_unknown_host_gets_no_new_replicas(leading, host, model):
    silent_for(host, 30)
    reconcile_once()
    create_deployment("chat", "tiny")
    reconcile_once()
    assert placed_on("chat") is None  # h1 has room but is cordoned


def test_an_unknown_host_is_evicted_after_the_timeout_and_its_replicas_move(leading, host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    second_host()
    Host.objects.filter(pk=host.pk).update(connected=False, unknown_since=timezone.now() - timedelta(seconds=61))
    reconcile_once()
    host.refresh_from_db()
    assert host.lifecycle == "offline" and host.evicted_at is not None
    reconcile_once()
    assert placed_on("chat") == "h2"


def test_evictions_are_bounded_per_minute(leading, host, model):
    leading.MODELGRID_EVICTION_RATE = 0.1  # of 4 hosts: at most one a minute
    others = [second_host(f"h{i}") for i in (2, 3, 4)]
    long_ago = timezone.now() - timedelta(seconds=300)
    for h in [host, *others[:2]]:
        Host.objects.filter(pk=h.pk).update(connected=False, unknown_since=long_ago)
    reconcile_once()
    reconcile_once()
    assert Host.objects.filter(evicted_at__isnull=False).count() == 1
    Host.objects.filter(evicted_at__isnull=False).update(evicted_at=timezone.now() - timedelta(seconds=61))
    reconcile_once()
    assert Host.objects.filter(evicted_at__isnull=False).count() == 2


def test_nothing_lapses_during_the_reconnect_grace(settings, host, model):
    settings.MODELGRID_RECONNECT_GRACE_SECONDS = 30
    reconcile.start_leading()  # a console that has just started
    silent_for(host, 3600)
    reconcile_once()
    host.refresh_from_db()
    assert host.connected


def test_a_console_restart_moves_nothing(leading, host, model):
    """SIGTERM closes every link (each marks its host unknown); the restarted console's passes run before the
    agents are back. Nothing moves, and the returning agent finds its replica where it was."""
    create_deployment("chat", "tiny")
    reconcile_once()
    second_host()
    before = Host.objects.get(pk=host.pk).generation
    apply_batch([Item(host.pk, host.name, Closed(epoch=host.link_epoch))])
    assert Host.objects.get(pk=host.pk).lifecycle == "unknown"
    reconcile.start_leading()
    for _ in range(3):
        reconcile_once()
    assert placed_on("chat") == "h1"
    assert Host.objects.get(pk=host.pk).generation == before


def test_only_the_current_links_close_marks_the_host_unknown(leading, host):
    Host.objects.filter(pk=host.pk).update(link_epoch=2)
    apply_batch([Item(host.pk, host.name, Closed(epoch=1))])  # a superseded link
    host.refresh_from_db()
    assert host.connected
    apply_batch([Item(host.pk, host.name, Closed(epoch=2))])
    host.refresh_from_db()
    assert host.lifecycle == "unknown"


def test_any_message_renews_the_lease_and_brings_an_evicted_host_back(leading, host):
    Host.objects.filter(pk=host.pk).update(connected=False, unknown_since=timezone.now(), evicted_at=timezone.now())
    apply_one(host, ReplicaStatus(replica_id=999, state="ready"))  # even one about no replica it has
    host.refresh_from_db()
    assert host.lifecycle == "connected" and host.evicted_at is None and host.unknown_since is None


def test_the_agents_failure_reason_survives_the_next_pass(leading, host, model):
    """One owner per fact: the scheduler's pass never overwrites what the agent said of a replica."""
    create_deployment("chat", "tiny")
    reconcile_once()
    replica = Replica.objects.get()
    apply_one(host, ReplicaStatus(replica_id=replica.pk, state="failed", reason="CUDA out of memory while loading"))
    reconcile_once()
    reconcile_once()
    replica.refresh_from_db()
    assert replica.observed_reason == "CUDA out of memory while loading"
    assert replica.reason and "CUDA" not in replica.reason  # the scheduler's own reason, beside it
    dep = Deployment.objects.get()
    assert dep.state == "failed" and "CUDA out of memory" in dep.reason


def test_a_console_restart_keeps_a_replica_whose_estimate_grew_after_it_was_placed(leading, host, model):
    """The probe's case: a replica measured bigger than its estimate (the next estimate is calibrated up), then a
    restart. Passes that ran before the agent was back found no room for the bigger estimate on the unknown
    host and stopped the healthy critical replica; its host's readings are stale, so it is held as it is."""
    from agent.protocol import Measurement

    create_deployment("crit", "tiny", priority="critical")
    reconcile_once()
    replica = Replica.objects.get()
    grown = replica.reserved_bytes * 3 // 2
    measured = Measurement(device="cpu", batch=1, seq=16, weights_bytes=grown, peak_bytes=grown, total_bytes=grown)
    apply_one(host, ReplicaStatus(replica_id=replica.pk, state="ready", measured_bytes=grown, measurement=measured))
    reconcile_once()
    before = Replica.objects.values_list("host_id", "desired_state", "reserved_bytes").get()
    generation = Host.objects.get(pk=host.pk).generation
    apply_batch([Item(host.pk, host.name, Closed(epoch=host.link_epoch))])  # SIGTERM closes the link
    reconcile.start_leading()
    for _ in range(3):
        reconcile_once()
    replica.refresh_from_db()
    assert Replica.objects.values_list("host_id", "desired_state", "reserved_bytes").get() == before
    assert "readings are stale" in replica.reason and replica.action == "keep"
    assert Host.objects.get(pk=host.pk).generation == generation  # nothing was pushed to it


def test_a_host_not_heard_since_the_scheduler_began_leading_gets_nothing_new_until_it_speaks(leading, host, model):
    from agent.protocol import HostReport

    Host.objects.filter(pk=host.pk).update(last_seen=timezone.now() - timedelta(seconds=8))  # before this term
    reconcile.start_leading()
    create_deployment("chat", "tiny")
    held = reconcile_once()
    assert placed_on("chat") is None
    # Nothing wakes a pass when a host turns fresh: the next unwoken one plans for it (its recheck is due now).
    assert held.recheck_at is not None and held.recheck_at <= timezone.now().timestamp()
    apply_one(host, HostReport(gpus=[]))  # its agent speaks: the lease is written again, the readings are its own
    reconcile_once()
    assert placed_on("chat") == "h1"
