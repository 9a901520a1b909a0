"""The sampler: a chore of the scheduler leader (console/control/chores.py) that reads every deployment's, host's and
the fleet's current figures in a handful of aggregate queries, whatever the fleet's size, and hands them to
the store, which keeps what changed (console/series/store.py), then prunes by age."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import Count, Q, Sum

from console.accounts.models import Team
from console.control.observed import gateway_detail
from console.deployments.models import Deployment, Replica
from console.fleet.models import Gpu, Host
from console.series.metrics import DEPLOYMENT, FLEET, HOST, TEAM
from console.series.store import Key, prune, record

log = logging.getLogger("modelgrid.series")

LOADED = ("ready", "preloaded")
TOWARD_READY = ("pending", "starting", "loading")


def sample(now: datetime) -> int:
    """Record one tick at `now` and prune; returns the points written (sync, DB)."""
    at = int(now.timestamp())
    values = deployment_values(now.timestamp()) | host_values()
    recorded = record(values, at)
    prune(at, thorough=recorded.window_closed)
    return recorded.points


def replica_group(observed: str, desired: str) -> str | None:
    """Which replicas series counts a replica: loaded, on its way to ready (placed, loading or waking),
    asleep, failed; None for one that is stopped and stays so."""
    if observed == "failed":
        return "replicas_failed"
    if observed in LOADED:
        return "replicas"
    if observed in TOWARD_READY or desired in LOADED:
        return "replicas_loading" if desired != "stopped" else None
    return "replicas_sleeping" if observed == "sleeping" else None


def deployment_values(now: float) -> dict[Key, float | None]:
    """Per deployment: the request rate and p95 the scheduler acts on (Deployment.traffic_rps and
    observed_p95_ms), p50, errors/s and queue wait as the gateway saw them (else as agents report them),
    and replicas by state; and the request rate summed per team and over the fleet. Four queries."""
    agents: dict[str, dict] = {}  # stand-ins where no console process reported lately: hosts' own figures
    for serving in Host.objects.filter(connected=True).order_by().values_list("serving", flat=True):
        for name, figures in (serving or {}).items():
            seen = agents.setdefault(name, {"errors": 0.0, "p50_ms": None})
            seen["errors"] += float(figures.get("request_rate") or 0.0) * float(figures.get("error_rate") or 0.0)
            if figures.get("p50_ms") is not None:
                seen["p50_ms"] = max(seen["p50_ms"] or 0.0, float(figures["p50_ms"]))
    counts: dict[int, dict[str, int]] = {}
    for dep, observed, desired, n in (Replica.objects.order_by().values_list("deployment_id", "observed_state",
                                                                              "desired_state").annotate(n=Count("pk"))):
        group = replica_group(observed, desired)
        if group:
            here = counts.setdefault(dep, {})
            here[group] = here.get(group, 0) + n
    values: dict[Key, float | None] = {}
    total = 0.0
    teams = dict.fromkeys(Team.objects.order_by().values_list("pk", flat=True), 0.0)  # a team with none: 0
    for pk, team, name, rps, p95, stats in Deployment.objects.order_by().values_list(
            "pk", "team_id", "name", "traffic_rps", "observed_p95_ms", "gateway_stats"):
        seen = gateway_detail(stats, now) or agents.get(name, {})
        here = counts.get(pk, {})
        for metric, value in (("request_rate", rps), ("p95_ms", p95), ("p50_ms", seen.get("p50_ms")),
                              ("errors", seen.get("errors", 0.0)), ("queue_ms", seen.get("queue_ms")),
                              ("replicas", here.get("replicas", 0)),
                              ("replicas_loading", here.get("replicas_loading", 0)),
                              ("replicas_sleeping", here.get("replicas_sleeping", 0)),
                              ("replicas_failed", here.get("replicas_failed", 0))):
            values[(DEPLOYMENT, pk, metric)] = value
        total += rps
        teams[team] = teams.get(team, 0.0) + rps
    values[(FLEET, 0, "request_rate")] = total
    values |= {(TEAM, team, "request_rate"): rate for team, rate in teams.items()}
    return values


def host_values() -> dict[Key, float | None]:
    """Per host and for the whole fleet: GPU memory reserved and measured by its replicas (as the dashboard's
    bars count them), used by others, in all, and the mean utilisation. Three queries."""
    connected = dict(Host.objects.order_by().values_list("pk", "connected"))
    on_gpu = {gpu: (reserved or 0, measured or 0, ready or 0) for gpu, reserved, measured, ready in (
        Replica.gpus.through.objects.order_by().values_list("gpu_id").annotate(
            r=Sum("replica__reserved_bytes"), m=Sum("replica__measured_bytes"),
            ready=Sum("replica__measured_bytes", filter=Q(replica__observed_state="ready"))))}
    hosts: dict[int, dict] = {pk: {"reserved_bytes": 0, "measured_bytes": 0, "total_bytes": 0, "foreign_bytes": 0,
                                   "util": []} for pk in connected}
    for pk, host, total, used, own, utilization in Gpu.objects.order_by().values_list(
            "pk", "host_id", "total_bytes", "used_bytes", "own_bytes", "utilization"):
        h = hosts.get(host)
        if h is None:  # its host was added after the hosts were read: next tick
            continue
        reserved, measured, ready = on_gpu.get(pk, (0, 0, 0))
        h["reserved_bytes"] += reserved
        h["measured_bytes"] += measured
        h["total_bytes"] += total
        # What ModelGrid's own workers hold is not foreign (draining, waking and loading ones included, as
        # the agent counts them); an agent that does not say is credited with its ready replicas' measurement.
        h["foreign_bytes"] += max(used - (own if own is not None else ready), 0)
        if utilization is not None:
            h["util"].append(utilization)
    values: dict[Key, float | None] = {}
    fleet = {"reserved_bytes": 0, "measured_bytes": 0, "total_bytes": 0, "foreign_bytes": 0}
    util: list[float] = []
    for pk, h in hosts.items():
        live = connected[pk]  # an unknown or offline host's readings are stale: a gap, not its last word
        for metric in ("reserved_bytes", "measured_bytes", "total_bytes"):
            values[(HOST, pk, metric)] = h[metric]
            fleet[metric] += h[metric]
        values[(HOST, pk, "foreign_bytes")] = h["foreign_bytes"] if live else None
        values[(HOST, pk, "utilization")] = sum(h["util"]) / len(h["util"]) if live and h["util"] else None
        if live:
            fleet["foreign_bytes"] += h["foreign_bytes"]
            util += h["util"]
    for metric, value in fleet.items():
        values[(FLEET, 0, metric)] = value
    values[(FLEET, 0, "utilization")] = sum(util) / len(util) if util else None
    return values
