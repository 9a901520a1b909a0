"""Prometheus metrics on a private registry, and the recent-window figures for host reports."""

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import AdapterStats, Metrics, ReplicaSnapshot, replica_snapshot
from agent.protocol import GpuInfo
from agent.workers.spec import WorkerSpec


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def metrics(clock):
    return Metrics(CollectorRegistry(), window_seconds=60, clock=clock)


def value(metrics, metric, **labels):
    return metrics.registry.get_sample_value(metric, labels)


def answer(metrics, deployment, seconds, status=200, adapter=None, queue=None, batch=None):
    metrics.request_started(deployment)
    metrics.request_finished(deployment, adapter, status, seconds, queue, batch)


def test_requests_are_counted_by_deployment_adapter_and_status_with_histograms(metrics):
    answer(metrics, "chat", 0.02, queue=0.001, batch=4)
    answer(metrics, "chat", 0.3, adapter="fr", queue=0.004, batch=2)
    answer(metrics, "chat", 0.01, status=400)
    assert value(metrics, "modelgrid_requests_total", deployment="chat", adapter="", status="200") == 1
    assert value(metrics, "modelgrid_requests_total", deployment="chat", adapter="fr", status="200") == 1
    assert value(metrics, "modelgrid_requests_total", deployment="chat", adapter="", status="400") == 1
    assert value(metrics, "modelgrid_request_duration_seconds_count", deployment="chat") == 3
    assert value(metrics, "modelgrid_request_duration_seconds_bucket", deployment="chat", le="0.025") == 2
    assert value(metrics, "modelgrid_queue_duration_seconds_count", deployment="chat") == 2  # only batched ones
    assert value(metrics, "modelgrid_batch_size_sum", deployment="chat") == 6
    assert value(metrics, "modelgrid_batch_size_bucket", deployment="chat", le="2.0") == 1


def test_the_queue_depth_follows_requests_in_flight_and_leaves_no_zero_series(metrics):
    metrics.request_started("chat")
    metrics.request_started("chat")
    assert value(metrics, "modelgrid_queue_depth", deployment="chat") == 2
    metrics.request_finished("chat", None, 200, 0.1)
    assert value(metrics, "modelgrid_queue_depth", deployment="chat") == 1
    metrics.request_finished("chat", None, 200, 0.1)
    assert value(metrics, "modelgrid_queue_depth", deployment="chat") is None


def test_gpu_and_replica_series_come_from_the_latest_snapshot_only(metrics):
    metrics.set_gpus([GpuInfo(index=0, uuid="GPU-0", name="H100", total_bytes=80, used_bytes=20,
                              utilization=25.0, simulated=False)])
    metrics.set_replicas([
        ReplicaSnapshot("chat", 1, "ready", load_seconds=1.5, adapters=AdapterStats(7, 2, 1, 3)),
        ReplicaSnapshot("embed", 2, "sleeping", load_seconds=0.4, wake_seconds=0.05),
    ])
    assert value(metrics, "modelgrid_gpu_memory_used_bytes", gpu="0", name="H100") == 20
    assert value(metrics, "modelgrid_gpu_memory_total_bytes", gpu="0", name="H100") == 80
    assert value(metrics, "modelgrid_gpu_utilization_ratio", gpu="0", name="H100") == 0.25
    assert value(metrics, "modelgrid_replica_state", deployment="chat", replica="1", state="ready") == 1
    assert value(metrics, "modelgrid_replica_state", deployment="chat", replica="1", state="loading") == 0
    assert value(metrics, "modelgrid_replica_state", deployment="embed", replica="2", state="sleeping") == 1
    assert value(metrics, "modelgrid_replica_load_seconds", deployment="chat", replica="1") == 1.5
    assert value(metrics, "modelgrid_replica_wake_seconds", deployment="embed", replica="2") == 0.05
    assert value(metrics, "modelgrid_adapter_hits_total", deployment="chat", replica="1") == 7
    assert value(metrics, "modelgrid_adapter_misses_total", deployment="chat", replica="1") == 2
    assert value(metrics, "modelgrid_adapter_evictions_total", deployment="chat", replica="1") == 1
    assert value(metrics, "modelgrid_adapters_loaded", deployment="chat", replica="1") == 3

    metrics.set_replicas([ReplicaSnapshot("chat", 1, "failed")])
    metrics.set_gpus([])
    text = metrics.render().decode()
    assert 'deployment="embed"' not in text and "H100" not in text
    assert 'modelgrid_replica_state{deployment="chat",replica="1",state="failed"} 1.0' in text
    assert "modelgrid_adapter_hits_total{" not in text


def test_the_window_gives_rate_error_rate_and_latency_percentiles(metrics, clock):
    for i in range(1, 21):  # 20 successes of 10 ms .. 200 ms
        answer(metrics, "chat", i / 100)
    answer(metrics, "chat", 5.0, status=500)
    answer(metrics, "chat", 0.001, status=429)
    answer(metrics, "chat", 0.001, status=400)  # the client's fault: neither an error nor a latency
    metrics.set_replicas([ReplicaSnapshot("idle", 3, "ready")])
    metrics.request_started("chat")
    snapshot = metrics.snapshot()
    chat, idle = snapshot.deployments
    assert chat.deployment == "chat" and chat.requests == 23 and chat.request_rate == pytest.approx(23 / 60)
    assert chat.error_rate == pytest.approx(2 / 23)
    assert chat.p50_seconds == pytest.approx(0.10) and chat.p95_seconds == pytest.approx(0.19)
    assert chat.queue_depth == 1
    assert (idle.deployment, idle.requests, idle.p50_seconds, idle.error_rate) == ("idle", 0, None, 0.0)
    assert snapshot.replicas == (ReplicaSnapshot("idle", 3, "ready"),)


def test_requests_older_than_the_window_drop_out(metrics, clock):
    answer(metrics, "chat", 1.0)
    clock.now += 30
    answer(metrics, "chat", 0.1)
    clock.now += 31  # the first is now 61 s old
    [chat] = metrics.snapshot().deployments
    assert chat.requests == 1 and chat.p95_seconds == pytest.approx(0.1)
    clock.now += 60
    assert metrics.snapshot().deployments == ()


def test_a_replica_snapshot_reads_what_the_worker_reported():
    class Handle:
        spec = WorkerSpec(4, "/m", "causal-lm", deployment="chat", index=2)
        state = "ready"
        info = {"output_dim": 8, "load_seconds": 2.5, "adapters": {"hits": 3, "misses": 1, "evictions": 0}}

    snapshot = replica_snapshot(Handle())
    assert snapshot == ReplicaSnapshot("chat", 4, "ready", load_seconds=2.5, adapters=AdapterStats(3, 1, 0, 0),
                                       index=2)
    assert snapshot.label == "chat#2"


def test_replica_series_name_each_replica_as_the_console_does(metrics):
    metrics.set_replicas([ReplicaSnapshot("chat", 17, "ready", load_seconds=1.5, index=0),
                          ReplicaSnapshot("chat", 18, "loading", index=1), ReplicaSnapshot("older", 9, "ready")])
    metrics.set_failures({18: 2})
    assert value(metrics, "modelgrid_replica_state", deployment="chat", replica="chat#0", state="ready") == 1
    assert value(metrics, "modelgrid_replica_load_seconds", deployment="chat", replica="chat#0") == 1.5
    assert value(metrics, "modelgrid_replica_failures_total", deployment="chat", replica="chat#1") == 2
    # From a console that sends no index: the replica's id, as before.
    assert value(metrics, "modelgrid_replica_state", deployment="older", replica="9", state="ready") == 1
    assert 'replica="17"' not in metrics.render().decode()


def test_two_instances_never_share_a_registry():
    first, second = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    answer(first, "chat", 0.1)
    assert second.registry.get_sample_value(
        "modelgrid_requests_total", {"deployment": "chat", "adapter": "", "status": "200"}
    ) is None


def test_foreign_gpu_memory_is_what_the_agents_own_workers_do_not_hold(metrics):
    metrics.set_gpus([
        GpuInfo(index=0, uuid="GPU-0", name="H100", total_bytes=80, used_bytes=50, simulated=False, own_bytes=30),
        GpuInfo(index=1, uuid="GPU-1", name="H100", total_bytes=80, used_bytes=50, simulated=False),
    ])
    assert value(metrics, "modelgrid_gpu_memory_foreign_bytes", gpu="0", name="H100") == 20
    # An agent that cannot tell its own memory apart says nothing rather than calling all of it foreign.
    assert value(metrics, "modelgrid_gpu_memory_foreign_bytes", gpu="1", name="H100") is None


def test_replica_failures_are_a_counter_from_zero_that_leaves_with_the_replica(metrics):
    metrics.set_failures({2: 3, 9: 1})
    metrics.set_replicas([ReplicaSnapshot("chat", 1, "ready"), ReplicaSnapshot("chat", 2, "failed")])
    assert value(metrics, "modelgrid_replica_failures_total", deployment="chat", replica="1") == 0
    assert value(metrics, "modelgrid_replica_failures_total", deployment="chat", replica="2") == 3
    # A scrape refreshes the replicas from their handles: the count stays.
    metrics.set_replicas([ReplicaSnapshot("chat", 2, "loading")])
    assert value(metrics, "modelgrid_replica_failures_total", deployment="chat", replica="2") == 3
    metrics.set_replicas([ReplicaSnapshot("chat", 1, "ready")])
    assert value(metrics, "modelgrid_replica_failures_total", deployment="chat", replica="2") is None
    assert "replica=\"9\"" not in metrics.render().decode()  # a replica with no handle has no series



def test_the_prefix_cache_of_a_replicas_engine_is_counted(metrics):
    from agent.workers.generation_spec import EngineStats

    class Handle:
        spec = WorkerSpec(4, "/m", "causal-lm", deployment="chat", index=0)
        state = "ready"
        info = {}
        engine_stats = EngineStats(prefill_tokens=700, prefix_hits=3, prefix_misses=1, prefix_hit_tokens=480,
                                   prefix_cache_bytes=1 << 20)

    metrics.set_replicas([replica_snapshot(Handle())])
    series = dict(deployment="chat", replica="chat#0")
    assert value(metrics, "modelgrid_prefix_cache_hits_total", **series) == 3
    assert value(metrics, "modelgrid_prefix_cache_misses_total", **series) == 1
    assert value(metrics, "modelgrid_prefix_cache_hit_tokens_total", **series) == 480
    assert value(metrics, "modelgrid_prefill_tokens_total", **series) == 700
    assert value(metrics, "modelgrid_prefix_cache_bytes", **series) == 1 << 20
