"""What was observed of each deployment, folded into the fields the scheduler reads: request rate, recent
p95 latency, whether it violates its SLO and since when.

The gateway's figures come first: they are what clients saw, queueing included. Agents' self-reports
(each only for the replicas on its own host) stand in when no gateway has reported lately."""

from __future__ import annotations

from datetime import datetime

from console.bulk import update_values
from console.carried import CarriedRows
from console.deployments.models import Deployment
from console.fleet.models import Host

GATEWAY_FRESH_S = 10.0  # a console process's figures older than this are from a process that is gone


def gateway_figures(stats: dict, now: float) -> tuple[float, float | None] | None:
    """(request rate, p95 ms) over the console processes that reported lately; None when none did."""
    fresh = [s for s in (stats or {}).values() if now - float(s.get("at", 0)) <= GATEWAY_FRESH_S]
    if not fresh:
        return None
    rate = sum(float(s.get("request_rate") or 0.0) for s in fresh)
    p95s = [float(s["p95_ms"]) for s in fresh if s.get("p95_ms") is not None]
    return rate, max(p95s) if p95s else None


def gateway_detail(stats: dict, now: float) -> dict | None:
    """Every figure of the console processes that reported lately, folded as above: rates and errors/s
    summed, p50, p95 and queue wait the worst process's (None where none saw a request); None when none did."""
    fresh = [s for s in (stats or {}).values() if now - float(s.get("at", 0)) <= GATEWAY_FRESH_S]
    if not fresh:
        return None

    def worst(key: str) -> float | None:
        seen = [float(s[key]) for s in fresh if s.get(key) is not None]
        return max(seen) if seen else None
    rates = [(float(s.get("request_rate") or 0.0), float(s.get("error_rate") or 0.0)) for s in fresh]
    return {"request_rate": sum(r for r, _ in rates), "errors": sum(r * e for r, e in rates),
            "p50_ms": worst("p50_ms"), "p95_ms": worst("p95_ms"), "queue_ms": worst("queue_ms")}


def refresh_observations(now: datetime) -> bool:
    """Aggregate connected hosts' serving figures per deployment; True if one entered or left its SLO
    (a rate or latency that merely moved is stored without counting as a change worth a refresh).

    The rate is the sum over hosts; the p95 is the worst host's (a conservative merge: the percentile of
    the union is not derivable from per-host percentiles, and the worst host is what violates the SLO)."""
    rate: dict[str, float] = {}
    p95: dict[str, float] = {}
    for serving in Host.objects.filter(connected=True).values_list("serving", flat=True):
        for name, figures in (serving or {}).items():
            rate[name] = rate.get(name, 0.0) + float(figures.get("request_rate") or 0.0)
            if figures.get("p95_ms") is not None:
                p95[name] = max(p95.get(name, 0.0), float(figures["p95_ms"]))
    changed = False
    moved = []
    for values in _DEPLOYMENTS.read():
        dep = dict(zip(_DEPLOYMENTS.fields, values, strict=True))
        name = dep["name"]
        seen = gateway_figures(dep["gateway_stats"], now.timestamp())
        if seen is not None:
            rate[name], observed = seen
        else:
            observed = p95.get(name)
        violating = bool(dep["slo_latency_ms"] and observed is not None and observed > dep["slo_latency_ms"])
        update = {"traffic_rps": round(rate.get(name, 0.0), 3), "observed_p95_ms": observed}
        if violating != dep["violating"] or dep["status_since"] is None:
            update |= {"violating": violating, "status_since": now}
        if any(dep[k] != v for k, v in update.items()):
            figures = {k: dep[k] for k in _FIGURES} | update
            moved.append((dep["pk"], *(figures[k] for k in _FIGURES)))
            changed |= "violating" in update
    # One statement per row, pipelined (a thousand new deployments each get their first figures in one pass).
    update_values(Deployment, _FIGURES, moved)
    return changed


_FIGURES = ("traffic_rps", "observed_p95_ms", "violating", "status_since")
_DEPLOYMENTS = CarriedRows(Deployment, ("pk", "name", "gateway_stats", "slo_latency_ms", *_FIGURES), ("pk",))
