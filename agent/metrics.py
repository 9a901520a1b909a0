"""The agent's Prometheus metrics, and the same figures as plain data for host reports (torch-free).

Requests are recorded as they finish. GPU and replica figures are the latest snapshot handed in and are
rendered afresh on every scrape, so a replica or GPU that is gone leaves no series behind.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.protocol import REPLICA_STATES, GpuInfo

CONTENT_TYPE = CONTENT_TYPE_LATEST
WINDOW_SECONDS = 60.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CANCEL_REASONS = ("client", "timeout")  # the client went away; the request's deadline passed


@dataclass(frozen=True)
class AdapterStats:
    """What a replica's adapter pool counted since it started."""

    hits: int = 0  # requests whose adapter was already on the GPU
    misses: int = 0  # requests that had to load their adapter first
    evictions: int = 0  # adapters dropped from the GPU to make room
    loaded: int = 0  # adapters on the GPU now


@dataclass(frozen=True)
class ReplicaSnapshot:
    """One replica as the metrics show it."""

    deployment: str
    replica_id: int
    state: str
    load_seconds: float | None = None  # its last load from disk
    wake_seconds: float | None = None  # its last wake from host memory
    adapters: AdapterStats | None = None
    running_sequences: int = 0  # generations decoding in its continuous batcher
    waiting_sequences: int = 0  # generations waiting for their prefill
    kv_cache_bytes: int = 0  # what their KV caches hold
    index: int | None = None  # its index among the deployment's replicas (None: the console sent none)
    prefix: PrefixStats | None = None  # its engine's prefix cache (None: its engine reports none)

    @property
    def label(self) -> str:
        """Its `replica` label: as the console's pages and API name it ("chat#0"), else its id."""
        return f"{self.deployment}#{self.index}" if self.index is not None else str(self.replica_id)


@dataclass(frozen=True)
class PrefixStats:
    """The built-in engine's prefix cache (agent.workers.prefix_cache), counted since the worker started."""

    prefill_tokens: int = 0  # prompt tokens run through the model
    hits: int = 0  # prompts that started from a cached prefix
    misses: int = 0
    hit_tokens: int = 0  # prompt tokens taken from the cache instead
    cache_bytes: int = 0  # what the cache holds now


@dataclass(frozen=True)
class DeploymentStats:
    """A deployment's service over the recent window, for the scheduler's SLO checks."""

    deployment: str
    requests: int  # finished within the window
    request_rate: float  # per second, over the whole window
    error_rate: float  # share of those that failed on our side (5xx) or were turned away (429)
    p50_seconds: float | None  # latency of the successful ones; None without any
    p95_seconds: float | None
    queue_depth: int  # requests waiting or running now


@dataclass(frozen=True)
class MetricsSnapshot:
    window_seconds: float
    deployments: tuple[DeploymentStats, ...]
    replicas: tuple[ReplicaSnapshot, ...]
    gpus: tuple[GpuInfo, ...]


class ObservedReplica(Protocol):
    """What replica_snapshot reads of a worker handle (the supervisor's WorkerHandle has it)."""

    spec: Any  # .deployment, .replica_id and .index
    state: str
    info: dict[str, Any]  # what the worker reported: load_seconds, wake_seconds, adapters (AdapterStats fields)


def replica_snapshot(handle: ObservedReplica) -> ReplicaSnapshot:
    """A handle's figures; load and wake times and adapter counts come from what its worker reported."""
    info = handle.info
    adapters = info.get("adapters")
    engine = getattr(handle, "engine_stats", None)  # agent.workers.generation_spec.EngineStats
    return ReplicaSnapshot(
        deployment=handle.spec.deployment,
        replica_id=handle.spec.replica_id,
        state=handle.state,
        load_seconds=_number(info.get("load_seconds")),
        wake_seconds=_number(info.get("wake_seconds")),
        adapters=_adapter_stats(adapters),
        running_sequences=getattr(engine, "running", 0),
        waiting_sequences=getattr(engine, "waiting", 0),
        kv_cache_bytes=getattr(engine, "kv_cache_bytes", 0),
        index=getattr(handle.spec, "index", None),
        prefix=_prefix_stats(engine),
    )


def _prefix_stats(engine: Any) -> PrefixStats | None:
    if engine is None or not (engine.prefill_tokens or engine.prefix_hits or engine.prefix_misses):
        return None  # no prompt yet, or an engine without a prefix cache
    return PrefixStats(engine.prefill_tokens, engine.prefix_hits, engine.prefix_misses, engine.prefix_hit_tokens,
                       engine.prefix_cache_bytes)


class Metrics:
    """One agent's metrics on an injected registry (tests pass a private one, never the global)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        window_seconds: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.window_seconds = window_seconds
        self._clock = clock
        self._requests = Counter(
            "modelgrid_requests",
            "Inference requests answered, by deployment, adapter ('' for the base model) and HTTP status.",
            ["deployment", "adapter", "status"],
            registry=registry,
        )
        self._latency = Histogram(
            "modelgrid_request_duration_seconds",
            "Time from a request's arrival to its answer.",
            ["deployment"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._queue = Histogram(
            "modelgrid_queue_duration_seconds",
            "Time a request waited in its replica's batching queue.",
            ["deployment"],
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )
        self._batch = Histogram(
            "modelgrid_batch_size",
            "Rows in the forward pass that answered a request.",
            ["deployment"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self._first_token = Histogram(
            "modelgrid_time_to_first_token_seconds",
            "Time from a generation's start to its first token.",
            ["deployment"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._inter_token = Histogram(
            "modelgrid_inter_token_seconds",
            "Time between two tokens of one generation.",
            ["deployment"],
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self._tokens = Counter(
            "modelgrid_generated_tokens", "Tokens generated (their rate is tokens/s).", ["deployment"],
            registry=registry,
        )
        self._cancelled = Counter(
            "modelgrid_generations_cancelled",
            "Generations ended early: the client went away (client) or the deadline passed (timeout).",
            ["deployment", "reason"],
            registry=registry,
        )
        self._recent: dict[str, deque[tuple[float, float, int]]] = {}  # deployment -> (finished at, seconds, status)
        self._in_flight: dict[str, int] = {}
        self._replicas: tuple[ReplicaSnapshot, ...] = ()
        self._gpus: tuple[GpuInfo, ...] = ()
        self._failures: dict[int, int] = {}  # replica id -> its workers that failed since this agent started
        registry.register(_SnapshotCollector(self))

    def request_started(self, deployment: str) -> None:
        self._in_flight[deployment] = self._in_flight.get(deployment, 0) + 1

    def request_finished(
        self,
        deployment: str,
        adapter: str | None,
        status: int,
        seconds: float,
        queue_seconds: float | None = None,
        batch_size: int | None = None,
    ) -> None:
        """Record one answered request (pairs with request_started)."""
        left = self._in_flight.get(deployment, 0) - 1
        if left > 0:
            self._in_flight[deployment] = left
        else:
            self._in_flight.pop(deployment, None)
        self._requests.labels(deployment, adapter or "", str(status)).inc()
        self._latency.labels(deployment).observe(seconds)
        if queue_seconds is not None:
            self._queue.labels(deployment).observe(queue_seconds)
        if batch_size is not None:
            self._batch.labels(deployment).observe(batch_size)
        now = self._clock()
        recent = self._recent.setdefault(deployment, deque())
        recent.append((now, seconds, status))
        self._prune(recent, now)

    def token(self, deployment: str, seconds: float, first: bool, count: int = 1) -> None:
        """One generated token, `seconds` after the generation started (first) or after its previous token; or
        `count` tokens that came together, `seconds` apart on average."""
        (self._first_token if first else self._inter_token).labels(deployment).observe(seconds)
        self._tokens.labels(deployment).inc(count)

    def cancelled(self, deployment: str, reason: str) -> None:
        """A generation ended early, for one of CANCEL_REASONS."""
        self._cancelled.labels(deployment, reason).inc()

    def set_gpus(self, gpus: Iterable[GpuInfo]) -> None:
        """Replace the GPU readings (the daemon hands in each reading it reports)."""
        self._gpus = tuple(gpus)

    def set_replicas(self, replicas: Iterable[ReplicaSnapshot]) -> None:
        """Replace the replica figures; the replicas not named are gone from the next scrape."""
        self._replicas = tuple(replicas)

    def set_failures(self, failures: dict[int, int]) -> None:
        """Replace the count of failed workers per replica id (the agent's restart bookkeeping)."""
        self._failures = dict(failures)

    def render(self) -> bytes:
        """The text exposition format for GET /metrics (content type CONTENT_TYPE)."""
        return generate_latest(self.registry)

    def snapshot(self) -> MetricsSnapshot:
        """The figures as plain data: per deployment over the window, plus the latest replicas and GPUs."""
        now = self._clock()
        for recent in self._recent.values():
            self._prune(recent, now)
        self._recent = {k: v for k, v in self._recent.items() if v}
        names = set(self._recent) | set(self._in_flight) | {r.deployment for r in self._replicas}
        stats = []
        for name in sorted(names):
            recent = self._recent.get(name, deque())
            ok = sorted(seconds for _, seconds, status in recent if status < 400)
            errors = sum(1 for _, _, status in recent if _is_error(status))
            stats.append(
                DeploymentStats(
                    deployment=name,
                    requests=len(recent),
                    request_rate=len(recent) / self.window_seconds,
                    error_rate=errors / len(recent) if recent else 0.0,
                    p50_seconds=_percentile(ok, 0.50),
                    p95_seconds=_percentile(ok, 0.95),
                    queue_depth=self._in_flight.get(name, 0),
                )
            )
        return MetricsSnapshot(self.window_seconds, tuple(stats), self._replicas, self._gpus)

    def _prune(self, recent: deque[tuple[float, float, int]], now: float) -> None:
        while recent and recent[0][0] <= now - self.window_seconds:
            recent.popleft()

    def _families(self) -> Iterator[Metric]:
        yield from _gpu_families(self._gpus)
        yield from _replica_families(self._replicas, self._failures)
        depth = GaugeMetricFamily(
            "modelgrid_queue_depth", "Requests waiting or running, by deployment.", labels=["deployment"]
        )
        # Every deployment with a replica here has a series, 0 when idle, so a dashboard can tell idle from absent.
        for deployment in sorted(set(self._in_flight) | {r.deployment for r in self._replicas}):
            depth.add_metric([deployment], self._in_flight.get(deployment, 0))
        yield depth


class _SnapshotCollector:
    # Renders the latest snapshot on each scrape instead of keeping labelled gauges that would go stale.
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics._families()


def _gpu_families(gpus: tuple[GpuInfo, ...]) -> Iterator[Metric]:
    labels = ["gpu", "name"]
    used = GaugeMetricFamily("modelgrid_gpu_memory_used_bytes", "GPU memory in use, by every process.", labels=labels)
    total = GaugeMetricFamily("modelgrid_gpu_memory_total_bytes", "GPU memory in all.", labels=labels)
    busy = GaugeMetricFamily("modelgrid_gpu_utilization_ratio", "Share of time the GPU was busy (0-1).", labels=labels)
    foreign = GaugeMetricFamily("modelgrid_gpu_memory_foreign_bytes", "GPU memory in use by processes that are not "
                                "this agent's workers.", labels=labels)
    for gpu in gpus:
        values = [str(gpu.index), gpu.name]
        used.add_metric(values, gpu.used_bytes)
        total.add_metric(values, gpu.total_bytes)
        if gpu.utilization is not None:  # simulated GPUs have no utilisation to report
            busy.add_metric(values, gpu.utilization / 100)
        if gpu.own_bytes is not None:
            foreign.add_metric(values, max(gpu.used_bytes - gpu.own_bytes, 0))
    yield from (used, total, busy, foreign)


def _replica_families(replicas: tuple[ReplicaSnapshot, ...], failed: dict[int, int]) -> Iterator[Metric]:
    labels = ["deployment", "replica"]
    state = GaugeMetricFamily(
        "modelgrid_replica_state", "1 for the state each replica is in, 0 for the others.", labels=[*labels, "state"]
    )
    load = GaugeMetricFamily("modelgrid_replica_load_seconds", "A replica's last load from disk.", labels=labels)
    wake = GaugeMetricFamily("modelgrid_replica_wake_seconds", "A replica's last wake from host memory.", labels=labels)
    hits = CounterMetricFamily("modelgrid_adapter_hits", "Requests whose adapter was on the GPU.", labels=labels)
    misses = CounterMetricFamily("modelgrid_adapter_misses", "Requests that loaded their adapter.", labels=labels)
    evictions = CounterMetricFamily("modelgrid_adapter_evictions", "Adapters dropped from the GPU.", labels=labels)
    loaded = GaugeMetricFamily("modelgrid_adapters_loaded", "Adapters on the GPU now.", labels=labels)
    running = GaugeMetricFamily("modelgrid_running_sequences", "Generations decoding now.", labels=labels)
    waiting = GaugeMetricFamily("modelgrid_waiting_sequences", "Generations waiting for their prefill.", labels=labels)
    kv = GaugeMetricFamily("modelgrid_kv_cache_bytes", "Bytes held by running generations' KV caches.", labels=labels)
    prefill = CounterMetricFamily("modelgrid_prefill_tokens", "Prompt tokens run through the model.", labels=labels)
    prefix_hits = CounterMetricFamily("modelgrid_prefix_cache_hits", "Prompts that started from a cached prefix.",
                                      labels=labels)
    prefix_misses = CounterMetricFamily("modelgrid_prefix_cache_misses", "Prompts looked up and not found.",
                                        labels=labels)
    hit_tokens = CounterMetricFamily("modelgrid_prefix_cache_hit_tokens", "Prompt tokens taken from the prefix "
                                     "cache instead of computed.", labels=labels)
    prefix_bytes = GaugeMetricFamily("modelgrid_prefix_cache_bytes", "Bytes the prefix cache holds.", labels=labels)
    # 0 included: a counter that first appears at 1 hides its first increase from rate() and increase().
    failures = CounterMetricFamily("modelgrid_replica_failures", "Worker processes of the replica that crashed, "
                                   "hung or failed to load (each restarted with backoff).", labels=labels)
    for replica in replicas:
        values = [replica.deployment, replica.label]
        known = REPLICA_STATES if replica.state in REPLICA_STATES else (*REPLICA_STATES, replica.state)
        for name in known:
            state.add_metric([*values, name], 1 if name == replica.state else 0)
        if replica.load_seconds is not None:
            load.add_metric(values, replica.load_seconds)
        if replica.wake_seconds is not None:
            wake.add_metric(values, replica.wake_seconds)
        if replica.adapters is not None:
            hits.add_metric(values, replica.adapters.hits)
            misses.add_metric(values, replica.adapters.misses)
            evictions.add_metric(values, replica.adapters.evictions)
            loaded.add_metric(values, replica.adapters.loaded)
        running.add_metric(values, replica.running_sequences)
        waiting.add_metric(values, replica.waiting_sequences)
        kv.add_metric(values, replica.kv_cache_bytes)
        if replica.prefix is not None:
            prefill.add_metric(values, replica.prefix.prefill_tokens)
            prefix_hits.add_metric(values, replica.prefix.hits)
            prefix_misses.add_metric(values, replica.prefix.misses)
            hit_tokens.add_metric(values, replica.prefix.hit_tokens)
            prefix_bytes.add_metric(values, replica.prefix.cache_bytes)
        failures.add_metric(values, failed.get(replica.replica_id, 0))
    yield from (state, load, wake, hits, misses, evictions, loaded, running, waiting, kv, prefill, prefix_hits,
                prefix_misses, hit_tokens, prefix_bytes, failures)


def _is_error(status: int) -> bool:
    return status >= 500 or status == 429


def _percentile(ordered: list[float], q: float) -> float | None:
    # Nearest rank: a latency some request really had, never an interpolation between two.
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _adapter_stats(value: Any) -> AdapterStats | None:
    if isinstance(value, AdapterStats) or value is None:
        return value
    if not isinstance(value, dict):
        return None
    return AdapterStats(**{f.name: int(value.get(f.name, 0)) for f in fields(AdapterStats)})


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
