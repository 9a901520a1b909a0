"""Which charts each page shows, read from the store: the deployment page's five, the dashboard's two and the
host page's two, each as its reader's team scope may see them (console/accounts/scope.py): a deployment of theirs,
any host (hosts are shared), and the fleet's request rate summed over their teams' deployments."""

from __future__ import annotations

import time
from functools import partial

from django.urls import reverse

from console.accounts.scope import TeamScope
from console.fleet.models import Host
from console.series.charts import Line
from console.series.charts import chart as draw
from console.series.metrics import DEPLOYMENT, FLEET, HOST
from console.series.store import COARSE_STEP_S, read_many, read_sum

# The range selector: key (the `range` parameter), seconds, label.
RANGES = (("15m", 900, "15 min"), ("1h", 3600, "1 h"), ("6h", 6 * 3600, "6 h"), ("24h", 86400, "24 h"),
          ("7d", 7 * 86400, "7 d"), ("30d", 30 * 86400, "30 d"))
DEFAULT_RANGE = "1h"
# Drawn at about the size they are shown: three small charts to a row on the deployment page, two on the dashboard.
SMALL, WIDE = (380, 160), (560, 180)
NO_REQUESTS = "no requests, or none recorded yet (a point every 10 s while the scheduler runs)."
REPLICA_LINES = (("replicas", "ready", "ready"), ("replicas_loading", "loading", "loading or waking"),
                 ("replicas_sleeping", "sleeping", "asleep"), ("replicas_failed", "failed", "failed"))


def range_key(value: str | None) -> str:
    """A `range` parameter as one of RANGES' keys (anything else: the default)."""
    return value if any(value == key for key, _, _ in RANGES) else DEFAULT_RANGE


def _panel(panel_id: str, title: str, url: str, key: str, charts: list[dict], resolution: int) -> dict:
    every = "5-minute means" if resolution == COARSE_STEP_S else "a point every 10 s where a value changed"
    return {"id": panel_id, "title": title, "url": f"{url}?range={key}", "range": key, "charts": charts,
            "resolution": resolution, "resolution_text": every,
            "ranges": [{"key": k, "label": label, "url": f"{url}?range={k}", "current": k == key}
                       for k, _, label in RANGES]}


def _window(key: str, now: float | None) -> tuple[float, float]:
    now = time.time() if now is None else now
    return now - dict((k, s) for k, s, _ in RANGES)[key], now


def deployment_panel(name: str, key: str, scope: TeamScope, now: float | None = None) -> dict | None:
    """The deployment page's charts over range `key`; None when `scope` has no such deployment (another team's is
    as missing as none)."""
    dep = scope.deployments().filter(name=name).values("pk", "slo_latency_ms").first()
    if dep is None:
        return None
    start, end = _window(key, now)
    reads = read_many(DEPLOYMENT, dep["pk"], ["request_rate", "p50_ms", "p95_ms", "queue_ms", "errors",
                                               *(r[0] for r in REPLICA_LINES)], start, end)
    res = reads["request_rate"].resolution_s
    slo = dep["slo_latency_ms"]

    def line(metric: str, css: str, label: str, **kw) -> Line:
        return Line(css, label, reads[metric].points, **kw)
    chart = partial(draw, size=SMALL)
    charts = [
        chart("request_rate", "Request rate", "req/s", [line("request_rate", "rate", "requests")], start, end, res,
              note="all console processes"),
        chart("latency", "Latency", "ms", [line("p50_ms", "p50", "p50"), line("p95_ms", "p95", "p95")], start, end,
              res, target=slo, target_label=f"SLO p95 {slo} ms" if slo else "",
              note="queueing included" + ("" if slo else " · no SLO target"), empty_reason=NO_REQUESTS),
        chart("queue_ms", "Queue wait", "ms", [line("queue_ms", "queue", "p95 wait")], start, end, res,
              note="for a ready replica, at the gateway",
              empty_reason="no requests came through this console's gateway, or none is recorded yet."),
        chart("errors", "Errors", "errors/s", [line("errors", "errors", "errors/s")], start, end, res,
              note="5xx answers other than 503"),
        chart("replicas", "Replicas by state", "replicas", [line(m, css, label) for m, css, label in REPLICA_LINES],
              start, end, res, stacked=True, note="stacked"),
    ]
    return _panel("charts", "Traffic, latency and replicas over time", reverse("deployment-charts", args=[name]),
                  key, charts, res)


def _memory_lines(reads: dict) -> list[Line]:
    return [Line("reserved", "reserved", reads["reserved_bytes"].points, fill=True),
            Line("measured", "measured", reads["measured_bytes"].points),
            Line("foreign", "other processes", reads["foreign_bytes"].points),
            Line("total", "total", reads["total_bytes"].points, dashed=True)]


def host_panel(name: str, key: str, now: float | None = None) -> dict | None:
    """The host page's charts over range `key`: its GPU memory and utilisation; None when there is no such host."""
    pk = Host.objects.filter(name=name).values_list("pk", flat=True).first()
    if pk is None:
        return None
    start, end = _window(key, now)
    reads = read_many(HOST, pk, ["reserved_bytes", "measured_bytes", "foreign_bytes", "total_bytes", "utilization"],
                      start, end)
    res = reads["total_bytes"].resolution_s
    chart = partial(draw, size=WIDE)
    charts = [
        chart("host_memory", "GPU memory", "bytes", _memory_lines(reads), start, end, res, note="all its GPUs"),
        chart("utilization", "GPU utilisation", "%", [Line("util", "mean", reads["utilization"].points)], start, end,
              res, note="mean over its GPUs", empty_reason="its GPUs report no utilisation (simulated GPUs do "
              "not), it is not connected, or nothing is recorded yet."),
    ]
    return _panel("host-charts", "GPU memory and utilisation over time", reverse("host-charts", args=[name]), key,
                  charts, res)


def fleet_panel(key: str, scope: TeamScope, now: float | None = None) -> dict:
    """The dashboard's charts over range `key`: the fleet's GPU memory (every team's: the GPUs are shared) and the
    request rate of the deployments `scope` sees."""
    start, end = _window(key, now)
    reads = read_many(FLEET, 0, ["reserved_bytes", "measured_bytes", "foreign_bytes", "total_bytes"], start, end)
    reads["request_rate"] = read_sum(scope.request_rate_series(), "request_rate", start, end)
    res = reads["total_bytes"].resolution_s
    chart = partial(draw, size=WIDE)
    charts = [
        chart("fleet_memory", "GPU memory", "bytes", _memory_lines(reads), start, end, res,
              note="every GPU of every host"),
        chart("fleet_request_rate", "Request rate", "req/s",
              [Line("rate", "requests", reads["request_rate"].points)], start, end, res,
              note="all deployments" if scope.everything else "your teams' deployments"),
    ]
    return _panel("fleet-charts", "The fleet over time", reverse("fleet-charts"), key, charts, res)
