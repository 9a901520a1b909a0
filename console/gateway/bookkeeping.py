"""What the gateway tells the scheduler, through the database: requests waiting for a replica (demand),
when each replica and deployment last had a request (idle grace, LRU, scale to zero), and what clients saw
(request rate and p95 latency with queueing included: the SLO loop's input; the p95 wait for a ready
replica, for the charts).

`Book` collects on the event loop (cheap, in memory); `drain` hands a batch to `write`, which runs in a
worker thread. Each console process writes its own traffic figures under its own key, so several
processes add up instead of overwriting each other."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from console.deployments.models import Deployment, Replica

WINDOW_S = 60.0  # traffic figures cover the last minute, like the agents' own
STATS_EVERY_S = 2.0
DEMAND_RENEW_S = 1.0  # waiting requests renew their demand this often (a count not renewed goes stale)


def _when(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, tz=UTC)


@dataclass
class Batch:
    """One flush: what changed since the last one."""

    now: float
    replicas_used: set[int] = field(default_factory=set)
    deployments_used: set[str] = field(default_factory=set)
    demand: dict[str, int] = field(default_factory=dict)  # renewed counts of waiting requests
    stats: dict[str, dict] | None = None  # this process's figures per deployment, when due
    process: str = ""


class Book:
    def __init__(self, process: str) -> None:
        self.process = process
        self._replicas: set[int] = set()
        self._deployments: set[str] = set()
        self._samples: dict[str, deque] = {}  # deployment -> (unix time, seconds, ok, queued s) in the window
        self._demand_renewed: dict[str, float] = {}
        self._stats_at = 0.0

    def used(self, deployment: str, replica_id: int) -> None:
        self._replicas.add(replica_id)
        self._deployments.add(deployment)

    def observe(self, deployment: str, seconds: float, status: int, now: float, queue_s: float = 0.0) -> None:
        samples = self._samples.setdefault(deployment, deque())
        samples.append((now, seconds, status < 500 or status == 503, queue_s))
        self._deployments.add(deployment)

    def drain(self, demand: dict[str, int], busy: set[int], now: float) -> Batch:
        batch = Batch(now, self._replicas | busy, self._deployments | set(demand), process=self.process)
        self._replicas, self._deployments = set(), set()
        for name, n in demand.items():
            if now - self._demand_renewed.get(name, 0.0) >= DEMAND_RENEW_S:
                batch.demand[name] = n
                self._demand_renewed[name] = now
        for name in [n for n in self._demand_renewed if n not in demand]:
            del self._demand_renewed[name]
        if now - self._stats_at >= STATS_EVERY_S:
            self._stats_at = now
            batch.stats = self._figures(now)
        return batch

    def _figures(self, now: float) -> dict[str, dict]:
        out = {}
        for name, samples in list(self._samples.items()):
            while samples and samples[0][0] < now - WINDOW_S:
                samples.popleft()
            if not samples:
                del self._samples[name]
                out[name] = {"requests": 0, "request_rate": 0.0, "error_rate": 0.0, "p50_ms": None,
                             "p95_ms": None, "queue_ms": None, "at": now}
                continue
            latencies = sorted(s[1] for s in samples)
            errors = sum(1 for s in samples if not s[2])
            out[name] = {
                "requests": len(samples),
                "request_rate": round(len(samples) / WINDOW_S, 3),
                "error_rate": round(errors / len(samples), 4),
                "p50_ms": round(1000 * latencies[len(latencies) // 2], 3),
                "p95_ms": round(1000 * _p95(latencies), 3),
                "queue_ms": round(1000 * _p95(sorted(s[3] for s in samples)), 3),
                "at": now,
            }
        return out


def _p95(ordered: list[float]) -> float:
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def write(batch: Batch) -> bool:
    """Apply one flush (sync, DB); True when a deployment this process saw no request for in its last figures has
    some now: the scheduler, which plans with the figures at every tick only while a deployment has traffic, is
    woken for it."""
    when = _when(batch.now)
    if batch.replicas_used:
        Replica.objects.filter(pk__in=batch.replicas_used).update(last_request_at=when)
    if batch.deployments_used:
        Deployment.objects.filter(name__in=batch.deployments_used).update(last_request_at=when)
    for name, n in batch.demand.items():
        Deployment.objects.filter(name=name).update(demand=n, demand_at=when)
    started = False
    if batch.stats:
        with transaction.atomic():
            # Locked in key order, as every writer of several deployment rows takes them (a scheduler pass holds
            # many at once: another order could deadlock with it), and no stronger than an update (the pass's FOR
            # KEY SHARE on the deployments whose replicas it writes goes on meanwhile).
            rows = Deployment.objects.filter(name__in=list(batch.stats)).order_by("pk")
            for dep in rows.select_for_update(of=("self",), no_key=True):
                stats = dict(dep.gateway_stats or {})
                figures, before = batch.stats[dep.name], stats.get(batch.process)
                if figures["requests"] == 0 and before is None:
                    continue
                started |= figures["requests"] > 0 and not (before or {}).get("requests")
                stats[batch.process] = figures
                Deployment.objects.filter(pk=dep.pk).update(gateway_stats=stats)
    return started


def announce_demand(name: str, waiting: int) -> None:
    """Requests wait for `name`: the scheduler's next pass owes it an answer (an old one no longer counts)."""
    now = timezone.now()
    Deployment.objects.filter(name=name).update(demand=waiting, demand_at=now, demand_since=now, demand_status="",
                                                demand_reason="")


def withdraw_demand(name: str) -> None:
    Deployment.objects.filter(name=name).update(demand=0)
