"""What is recorded for each kind of object: metric names, units and what each means (the API and the
charts read these; the sampler fills them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEPLOYMENT, HOST, FLEET, TEAM = "deployment", "host", "fleet", "team"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # req/s | ms | errors/s | replicas | bytes | %
    label: str

    @property
    def whole(self) -> bool:
        """Counted in whole units (bytes, replicas): shown and returned as integers."""
        return self.unit in ("bytes", "replicas")


DEPLOYMENT_METRICS = {m.name: m for m in (
    Metric("request_rate", "req/s", "requests per second, summed over console processes (else hosts)"),
    Metric("p50_ms", "ms", "median latency clients saw, queueing included (worst console process)"),
    Metric("p95_ms", "ms", "95th-percentile latency, as the SLO loop reads it"),
    Metric("queue_ms", "ms", "95th-percentile wait for a ready replica at the gateway"),
    Metric("errors", "errors/s", "failed requests per second (5xx other than 503)"),
    Metric("replicas", "replicas", "ready (or standby: loaded, not serving)"),
    Metric("replicas_loading", "replicas", "starting, loading or waking toward ready"),
    Metric("replicas_sleeping", "replicas", "asleep in host RAM"),
    Metric("replicas_failed", "replicas", "failed"),
)}

HOST_METRICS = {m.name: m for m in (
    Metric("reserved_bytes", "bytes", "GPU memory its replicas reserve"),
    Metric("measured_bytes", "bytes", "GPU memory its replicas measured after loading"),
    Metric("foreign_bytes", "bytes", "GPU memory used by processes ModelGrid does not own"),
    Metric("total_bytes", "bytes", "GPU memory in all"),
    Metric("utilization", "%", "GPU utilisation, the mean over its GPUs"),
)}

FLEET_METRICS = HOST_METRICS | {"request_rate": DEPLOYMENT_METRICS["request_rate"]}
# A team's deployments summed: what a member's dashboard shows of the fleet's traffic (console/accounts/scope.py).
TEAM_METRICS = {"request_rate": DEPLOYMENT_METRICS["request_rate"]}

METRICS = {DEPLOYMENT: DEPLOYMENT_METRICS, HOST: HOST_METRICS, FLEET: FLEET_METRICS, TEAM: TEAM_METRICS}

# Per unit, how finely a value is kept: changes below it are jitter no chart shows, and storing them would
# write a row each tick for a value that is in effect steady.
SIGNIFICANT_DIGITS = 3


def quantize(value: float | None, unit: str) -> float | None:
    """`value` as stored: bytes whole, the rest to three significant digits (replica counts stay exact, their
    5-minute means keep a fraction); None for no reading or a non-finite one."""
    if value is None or not math.isfinite(value):
        return None
    if unit == "bytes":
        return float(round(value))
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
