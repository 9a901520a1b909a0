"""The sampler: what it reads from the fleet follows the database, it runs as the leader's chore, and it
stays a handful of queries however many rows there are."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.accounts.models import default_team_id
from console.control.chores import _chores
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.fleet.models import Gpu, Host
from console.series.models import Point
from console.series.sampler import deployment_values, host_values, replica_group, sample
from console.series.store import read
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db
GiB = 1 << 30


def replica(dep, index, gpus=(), **fields):
    row = Replica.objects.create(deployment=dep, index=index, host=gpus[0].host if gpus else None, **fields)
    row.gpus.set(gpus)
    return row


def of(values, kind, pk):
    return {metric: v for (k, o, metric), v in values.items() if (k, o) == (kind, pk)}


def test_a_deployment_reads_what_the_gateway_saw_and_what_the_scheduler_folded(host, model):
    dep = create_deployment("chat", "tiny")
    now = timezone.now().timestamp()
    Deployment.objects.filter(pk=dep.pk).update(traffic_rps=12.0, observed_p95_ms=80.0, gateway_stats={
        "console-a:1": {"request_rate": 10.0, "error_rate": 0.1, "p50_ms": 20.0, "p95_ms": 80.0, "queue_ms": 4.0,
                        "at": now},
        "console-b:2": {"request_rate": 2.0, "error_rate": 0.5, "p50_ms": 35.0, "p95_ms": 60.0, "queue_ms": None,
                        "at": now},
        "console-c:3": {"request_rate": 50.0, "error_rate": 1.0, "p50_ms": 900.0, "at": now - 120},  # gone
    })
    seen = of(deployment_values(now), "deployment", dep.pk)
    assert seen["request_rate"] == 12.0 and seen["p95_ms"] == 80.0
    assert seen["p50_ms"] == 35.0  # the worst fresh process, as for p95
    assert seen["errors"] == pytest.approx(10 * 0.1 + 2 * 0.5)  # errors per second, summed
    assert seen["queue_ms"] == 4.0


def test_agents_figures_stand_in_when_no_gateway_reported(host, model):
    dep = create_deployment("chat", "tiny")
    other = Host.objects.create(name="h2", connected=True)
    Host.objects.filter(pk=host.pk).update(serving={"chat": {"request_rate": 4.0, "error_rate": 0.25, "p50_ms": 9.0}})
    Host.objects.filter(pk=other.pk).update(serving={"chat": {"request_rate": 2.0, "error_rate": 0.0, "p50_ms": 30.0}})
    seen = of(deployment_values(timezone.now().timestamp()), "deployment", dep.pk)
    assert seen["errors"] == 1.0 and seen["p50_ms"] == 30.0
    assert seen["queue_ms"] is None  # agents do not see the gateway's queue


def test_a_deployment_without_traffic_has_no_latency(host, model):
    dep = create_deployment("quiet", "tiny")
    seen = of(deployment_values(timezone.now().timestamp()), "deployment", dep.pk)
    assert (seen["request_rate"], seen["errors"], seen["p50_ms"], seen["p95_ms"], seen["queue_ms"]) == \
        (0.0, 0.0, None, None, None)


@pytest.mark.parametrize("observed, desired, group", [
    ("ready", "ready", "replicas"), ("preloaded", "preloaded", "replicas"),
    ("loading", "ready", "replicas_loading"), ("pending", "ready", "replicas_loading"),
    ("sleeping", "ready", "replicas_loading"),  # waking
    ("sleeping", "sleeping", "replicas_sleeping"), ("ready", "sleeping", "replicas"),  # still serving
    ("failed", "ready", "replicas_failed"), ("stopped", "stopped", None),
])
def test_replicas_are_grouped_by_what_they_are_doing(observed, desired, group):
    assert replica_group(observed, desired) == group


def test_replica_counts_follow_the_rows(host, model):
    dep = create_deployment("chat", "tiny")
    Replica.objects.filter(deployment=dep).delete()
    for i, (observed, desired) in enumerate([("ready", "ready"), ("ready", "ready"), ("sleeping", "sleeping"),
                                             ("failed", "ready"), ("loading", "ready")]):
        replica(dep, i, observed_state=observed, desired_state=desired)
    seen = of(deployment_values(timezone.now().timestamp()), "deployment", dep.pk)
    assert (seen["replicas"], seen["replicas_loading"], seen["replicas_sleeping"], seen["replicas_failed"]) == \
        (2, 1, 1, 1)


def test_host_memory_is_reserved_measured_and_foreign_as_the_grid_counts_it(host, model):
    dep = create_deployment("chat", "tiny")
    Replica.objects.filter(deployment=dep).delete()
    g0, g1 = host.gpus.order_by("index")
    replica(dep, 0, [g0], reserved_bytes=6 * GiB, measured_bytes=5 * GiB, observed_state="ready")
    replica(dep, 1, [g1], reserved_bytes=2 * GiB, measured_bytes=None, observed_state="loading")
    # g0: the agent says its own workers hold 5 GiB of 9 used; g1: it does not say, so only ready replicas
    # count as ours (none): all 3 GiB used there are foreign.
    Gpu.objects.filter(pk=g0.pk).update(used_bytes=9 * GiB, own_bytes=5 * GiB, utilization=80.0)
    Gpu.objects.filter(pk=g1.pk).update(used_bytes=3 * GiB, own_bytes=None, utilization=20.0)
    values = host_values()
    seen = of(values, "host", host.pk)
    assert seen == {"reserved_bytes": 8 * GiB, "measured_bytes": 5 * GiB, "foreign_bytes": 7 * GiB,
                    "total_bytes": 32 * GiB, "utilization": 50.0}
    assert of(values, "fleet", 0) == seen


def test_a_host_that_is_not_connected_has_gaps_for_its_readings(host):
    Host.objects.filter(pk=host.pk).update(connected=False, unknown_since=timezone.now())
    Gpu.objects.filter(host=host).update(used_bytes=GiB, utilization=50.0)
    seen = of(host_values(), "host", host.pk)
    assert seen["foreign_bytes"] is None and seen["utilization"] is None
    assert seen["total_bytes"] == 32 * GiB


def test_the_fleet_sums_its_hosts_and_deployments(host, model):
    other = Host.objects.create(name="h2", connected=True)
    Gpu.objects.create(host=other, index=0, uuid="G", name="sim", total_bytes=16 * GiB, used_bytes=GiB,
                       own_bytes=0, utilization=10.0)
    a, b = create_deployment("a", "tiny"), create_deployment("b", "tiny")
    Deployment.objects.filter(pk=a.pk).update(traffic_rps=1.5)
    Deployment.objects.filter(pk=b.pk).update(traffic_rps=2.0)
    now = timezone.now()
    sample(now)
    at = now.timestamp()
    assert read("fleet", "total_bytes", at - 60, now=at + 1)[-1][1] == 48 * GiB
    assert read("fleet", "foreign_bytes", at - 60, now=at + 1)[-1][1] == GiB
    assert read("fleet", "request_rate", at - 60, now=at + 1)[-1][1] == 3.5


def test_it_is_one_of_the_leaders_chores():
    assert ("series", sample) in _chores()


def test_each_tick_follows_the_database(host, model):
    dep = create_deployment("chat", "tiny")
    now = timezone.now()
    sample(now)
    Deployment.objects.filter(pk=dep.pk).update(traffic_rps=7.0)
    sample(now + timedelta(seconds=10))
    sample(now + timedelta(seconds=20))
    t = int(now.timestamp())
    assert read("deployment/chat", "request_rate", t - 5, now=t + 25) == [(t, 0.0), (t + 10, 7.0), (t + 20, 7.0)]


def test_a_deleted_deployment_gets_a_gap(host, model):
    create_deployment("chat", "tiny")
    now = timezone.now()
    sample(now)
    Deployment.objects.filter(name="chat").delete()
    sample(now + timedelta(seconds=10))
    assert list(Point.objects.filter(t=int(now.timestamp()) + 10).values_list("value", flat=True).distinct()) == [None]


def steady_queries(now) -> tuple[int, int]:
    """(points written, queries) of a tick after one that recorded everything."""
    sample(now)
    with CaptureQueriesContext(connection) as queries:
        written = sample(now + timedelta(seconds=10))
    return written, len(queries)


def test_a_steady_fleet_writes_nothing_and_its_queries_do_not_grow_with_it(host, model):
    create_deployment("d0", "tiny")
    # Inside one 5-minute window: no window closes (and writes its means) between these ticks.
    now = datetime.fromtimestamp(int(time.time()) // 300 * 300 - 3000 + 100, tz=UTC)
    written, few = steady_queries(now)
    assert written == 0
    for i in range(1, 40):
        create_deployment(f"d{i}", "tiny")
        h = Host.objects.create(name=f"extra-{i}", connected=True)
        Gpu.objects.create(host=h, index=0, uuid=f"G{i}", name="sim", total_bytes=GiB)
    written, many = steady_queries(now + timedelta(seconds=20))
    assert written == 0 and many == few


def test_the_request_rate_is_summed_per_team_too(tmp_path):
    scene = team_scene(tmp_path)
    Deployment.objects.filter(name="chat-a").update(traffic_rps=5.0)
    Deployment.objects.filter(name="chat-b").update(traffic_rps=2.0)
    values = deployment_values(time.time())
    assert values[("team", scene.a.pk, "request_rate")] == 5.0 and values[("team", scene.b.pk, "request_rate")] == 2.0
    assert values[("fleet", 0, "request_rate")] == 7.0
    assert values[("team", default_team_id(), "request_rate")] == 0.0  # a team without deployments: none, not a gap
