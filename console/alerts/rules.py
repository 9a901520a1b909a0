"""When each kind of alert fires: plain functions of what was read, no database, so each rule is tested alone.
Each returns what fires now, as {object: message}; an alert resolves when its object is no longer returned."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from console.scheduler.explain import seconds  # durations in the scheduler's words


@dataclass(frozen=True)
class DeploymentSlo:
    name: str
    violating: bool
    since: datetime | None  # when it entered (or left) its SLO
    p95_ms: float | None
    target_ms: int | None


def slo_violations(deployments: Iterable[DeploymentSlo], window_s: float, now: datetime) -> dict[str, str]:
    """Deployments out of their SLO for longer than the window."""
    out = {}
    for d in deployments:
        if d.violating and d.since is not None and (now - d.since).total_seconds() >= window_s:
            p95 = "unknown" if d.p95_ms is None else f"{d.p95_ms:.0f} ms"
            out[f"deployment/{d.name}"] = (f"p95 latency {p95} above its {d.target_ms} ms target for "
                                           f"{seconds((now - d.since).total_seconds())}")
    return out


def failing_replicas(failures: dict[str, int], threshold: float, window_s: float) -> dict[str, str]:
    """Replicas (replica/NAME#I -> failures within the window) that failed at least `threshold` times."""
    return {obj: f"failed {n} times in the last {seconds(window_s)} (its worker keeps failing; see its log and events)"
            for obj, n in failures.items() if n >= max(threshold, 1)}


@dataclass(frozen=True)
class HostLife:
    name: str
    state: str  # connected | unknown | offline
    since: datetime | None  # unknown_since (or evicted_at)


def offline_hosts(hosts: Iterable[HostLife], window_s: float, now: datetime) -> dict[str, str]:
    """Hosts unknown or offline for longer than the window."""
    out = {}
    for h in hosts:
        if h.state != "connected" and h.since is not None and (now - h.since).total_seconds() >= window_s:
            out[f"host/{h.name}"] = (f"{h.state} for {seconds((now - h.since).total_seconds())}: no word from its "
                                     "agent" + ("; its replicas were placed elsewhere" if h.state == "offline" else ""))
    return out


def growing_foreign(samples: dict[str, list[tuple[float, float | None]]], threshold: float,
                    window_s: float) -> dict[str, str]:
    """Hosts (host/NAME -> foreign-memory points over the window) whose memory used by other processes rose by
    more than `threshold` bytes from the window's lowest point to its last."""
    out = {}
    for obj, points in samples.items():
        values = [v for _, v in points if v is not None]
        if len(values) < 2:
            continue
        low, last = min(values), values[-1]
        if last - low > threshold:
            grew, now_gib = (last - low) / (1 << 30), last / (1 << 30)
            out[obj] = (f"memory used by processes ModelGrid does not own grew by {grew:.2f} GiB in "
                        f"{seconds(window_s)} (now {now_gib:.2f} GiB): the scheduler has that much less room")
    return out
