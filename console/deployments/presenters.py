"""Deployments as plain data for the API and pages."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from console.catalog.memory import memory_summary
from console.control.snapshot import live_demand
from console.deployments.models import Deployment, Replica
from console.deployments.serving import SERVING_HINTS, serving_state
from console.fleet.models import Gpu

# Observed states on the way to `ready`: while a replica is in one of them and meant to be ready, its
# target goes without saying.
_ON_THE_WAY = ("pending", "starting", "loading")
# A scale-up creates the new rows in the pass that sets last_scale_at, so they are this close behind it.
_SAME_PASS = timedelta(seconds=10)
# What the next request meets, for the word's tooltip and the deployment page.
# The scheduler's answer to waiting requests, as the page words it.
DEMAND_LABELS = {"served": "a replica is on its way", "waiting": "queued", "refused": "cannot be served now"}


def replica_memory(r: Replica) -> dict:
    """Estimated (as reserved, calibrated), measured and the error between them, for one replica."""
    if not r.reservation:
        return memory_summary(None, None, 0, r.measured_bytes)
    return memory_summary(r.reserved_bytes, r.reservation.get("estimated_bytes"),
                          r.reservation.get("calibrated_from", 0), r.measured_bytes) | {
        "device": r.reservation.get("device")}


def replica_data(r: Replica) -> dict:
    """One replica: placement, states, the scheduler's last decision, memory, load and sleep figures."""
    return {
        "index": r.index,
        "host": r.host.name if r.host else None,
        "gpus": sorted(g.index for g in r.gpus.all()),
        "state": r.observed_state,
        "desired_state": r.desired_state,
        "reserved_bytes": r.reserved_bytes,
        "measured_bytes": r.measured_bytes,
        "memory": replica_memory(r),
        "action": r.action,
        "mps_percentage": r.mps_percentage,
        "endpoint": r.host.endpoint if r.host and r.host.endpoint else None,
        "pid": r.pid,
        "reason": r.reason,
        "observed_reason": r.observed_reason,
        "loaded_bytes": r.loaded_bytes,
        "loading_total_bytes": r.loading_total_bytes,
        "host_bytes": r.host_bytes,
        "sleep_wake": r.sleep_wake or None,
        "adapter_stats": r.adapter_stats or [],
        "adapter_error": r.adapter_error,
        "last_request_at": r.last_request_at,
    }


def adapter_usage(dep: Deployment, replicas: list[Replica]) -> list[dict]:
    """Each registered adapter with its tier on every replica that reported it, and its requests, hits
    and misses summed over those replicas."""
    out = []
    for a in dep.adapters.all():
        tiers, requests, hits, misses = [], 0, 0, 0
        for r in replicas:
            for s in r.adapter_stats or []:
                if s.get("name") == a.name:
                    tiers.append({"replica": r.index, "tier": s.get("tier", "disk")})
                    requests += s.get("requests", 0)
                    hits += s.get("hits", 0)
                    misses += s.get("misses", 0)
        out.append({"name": a.name, "path": a.path, "rank": a.rank, "nbytes": a.nbytes, "pinned": a.pinned,
                    "tiers": tiers, "requests": requests, "hits": hits, "misses": misses})
    return out


def replica_rows(dep: Deployment) -> list[Replica]:
    return list(dep.replica_set.select_related("host").prefetch_related("gpus").order_by("index"))


# Host columns a listed replica never shows: the desired state pushed to its agent and its serving figures can
# be kilobytes per host, read once for each of its replicas.
_UNSHOWN_HOST_FIELDS = ("host__desired", "host__serving", "host__labels")


def listed(deployments: QuerySet) -> QuerySet:
    """`deployments` with everything deployment_data() reads fetched in a fixed number of queries (the
    replicas, their hosts and GPUs, the adapters), however many rows the page has. Replicas land in
    `listed_replicas`."""
    replicas = (Replica.objects.select_related("host").defer(*_UNSHOWN_HOST_FIELDS).order_by("index")
                .prefetch_related(Prefetch("gpus", queryset=Gpu.objects.order_by())))
    return deployments.select_related("model", "team").prefetch_related(
        Prefetch("replica_set", queryset=replicas, to_attr="listed_replicas"), "adapters")


def deployments_data(deployments) -> list[dict]:
    """deployment_data() for each of `deployments`, read through listed() (a page of it): no query per row."""
    return [deployment_data(d, d.listed_replicas) for d in deployments]


def deployment_data(dep: Deployment, replicas: list[Replica] | None = None, fresh: bool = False) -> dict:
    """A deployment with its replicas and adapters (the API's DeploymentOut); `replicas` as read by
    replica_rows() when the caller has them already. `fresh`: just created, so it has neither (nothing is read:
    a script creating thousands of deployments paid two queries a create for two empty lists)."""
    replicas = [] if fresh else replica_rows(dep) if replicas is None else replicas
    return {
        "name": dep.name,
        "model": dep.model.name,
        "team": dep.team.name,
        "replica_count": dep.replicas,
        "min_replicas": dep.min_replicas,
        "max_replicas": dep.max_replicas,
        "gpus_per_replica": dep.gpus_per_replica,
        "selector": dep.selector,
        "tolerations": dep.tolerations,
        "spread": dep.spread,
        "priority": dep.priority,
        "slo_latency_ms": dep.slo_latency_ms,
        "latency_critical": dep.latency_critical,
        "profile": dep.profile,
        "engine": dep.engine,
        "engine_args": list(dep.engine_args or []),
        "traffic_rps": dep.traffic_rps,
        "observed_p95_ms": dep.observed_p95_ms,
        "violating": dep.violating,
        "status_since": dep.status_since,
        "last_scale_at": dep.last_scale_at,
        "max_batch_size": dep.max_batch_size,
        "max_batch_delay_ms": dep.max_batch_delay_ms,
        "standby": dep.standby,
        "idle_timeout_s": dep.idle_timeout_s,
        "serving": serving_state(replicas, dep.standby, dep.demand_status),
        "last_request_at": dep.last_request_at,
        "demand": waiting_requests(dep),
        "demand_status": dep.demand_status,
        "demand_reason": dep.demand_reason,
        "dtype": dep.serving_dtype,
        "batch": dep.batch,
        "seq": dep.seq,
        "estimates": dep.estimates,
        "adapters": [] if fresh else adapter_usage(dep, replicas),
        "state": dep.state,
        "reason": dep.reason,
        "created": dep.created,
        "replicas": [replica_data(r) for r in replicas],
    }


def waiting_requests(dep: Deployment, now: datetime | None = None) -> int:
    """Requests waiting at the gateway for a ready replica: the count it last wrote, 0 once stale (the
    scheduler's own rule, so the page never shows demand the scheduler ignores)."""
    return live_demand(dep, (now or timezone.now()).timestamp(), settings.MODELGRID_DEMAND_STALE_SECONDS)


# Pages: what the figures mean, for the deployment page and the dashboard's table.

def for_people(seconds: int) -> str:
    """A whole number of seconds in the largest unit that divides it: "45 s", "5 min", "2 h", "7 days"."""
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            n = seconds // size
            return f"{n} {unit}{'s' if unit == 'day' and n != 1 else ''}"
    return f"{seconds} s"


def idle_after(dep: Deployment) -> str | None:
    """How long without requests before it scales to zero ("5 min"); None for one that never does."""
    if dep.min_replicas or not dep.max_replicas:
        return None
    return for_people(dep.idle_timeout_s)


def demand_view(dep: Deployment, now: datetime | None = None) -> dict | None:
    """Requests waiting for a replica and the scheduler's answer ("2 requests waiting: waiting for std#0 to
    go idle"), or None when nothing waits."""
    count = waiting_requests(dep, now)
    if not count:
        return None
    status = dep.demand_status or "waiting"
    text = f"{count} request{'s' if count != 1 else ''} waiting"
    return {"count": count, "status": status, "label": DEMAND_LABELS.get(status, status),
            "reason": dep.demand_reason, "text": f"{text}: {dep.demand_reason}" if dep.demand_reason else text}


def serving_view(dep: Deployment, replicas: list[Replica]) -> dict:
    """The serving word and what it means for the next request."""
    word = serving_state(replicas, dep.standby, dep.demand_status)
    return {"word": word, "hint": SERVING_HINTS[word]}


def slo_status(dep: Deployment) -> dict:
    """Where the deployment stands against its p95 target: none, waiting (no traffic measured), ok or
    violating, and since when (the time it last entered or left its SLO)."""
    if not dep.slo_latency_ms:
        kind, label = "none", "no SLO"
    elif dep.observed_p95_ms is None:
        kind, label = "waiting", "no traffic yet"
    elif dep.violating:
        kind, label = "violating", "violating"
    else:
        kind, label = "ok", "within SLO"
    since = dep.status_since if kind in ("ok", "violating") else None
    return {"kind": kind, "label": label, "since": since, "target_ms": dep.slo_latency_ms,
            "observed_ms": dep.observed_p95_ms}


def scale_status(dep: Deployment, replicas: list[Replica]) -> dict:
    """The replica target within its range and the last change the scheduler made to it.

    The direction is read from the rows: a scale-up creates rows in the same pass, a scale-down deletes
    them; when rows were added later by hand the direction is unknown."""
    direction = None
    if dep.last_scale_at:
        later = [r.created for r in replicas if r.created >= dep.last_scale_at]
        if not later:
            direction = "down"
        elif any(c - dep.last_scale_at <= _SAME_PASS for c in later):
            direction = "up"
    return {"target": dep.replicas, "min": dep.min_replicas, "max": dep.max_replicas,
            "fixed": dep.min_replicas == dep.max_replicas, "direction": direction, "at": dep.last_scale_at}


def state_counts(replicas: list[Replica]) -> list[tuple[str, int]]:
    """How many replicas are in each observed state, most useful first ("1 ready, 1 loading")."""
    order = ("ready", "preloaded", "loading", "starting", "pending", "sleeping", "stopped", "failed")
    counts: dict[str, int] = {}
    for r in replicas:
        counts[r.observed_state] = counts.get(r.observed_state, 0) + 1
    return sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))


def deployment_row(dep: Deployment) -> dict:
    """A deployment as one row of the dashboard: policy, replica range, SLO standing, state."""
    replicas = list(dep.replica_set.all())
    return {
        "name": dep.name,
        "model": dep.model.name,
        "priority": dep.priority,
        "latency_critical": dep.latency_critical,
        "traffic_rps": dep.traffic_rps,
        "state": dep.state,
        "reason": dep.reason,
        "slo": slo_status(dep),
        "scale": scale_status(dep, replicas),
        "counts": state_counts(replicas),
        "serving": serving_view(dep, replicas),
        "demand": demand_view(dep),
        "idle_after": idle_after(dep),
    }


def load_progress(state: str, loaded: int | None, total: int | None) -> int | None:
    """Percent of the checkpoint read while a replica loads; None otherwise or when the total is unknown."""
    if state != "loading" or not total:
        return None
    return min(100, int(100 * (loaded or 0) / total))


def heading_for(state: str, desired: str) -> str | None:
    """The target state worth showing beside the observed one (``sleeping → ready``): none when they
    agree, or when a replica meant to be ready is simply on its way there."""
    if desired == state or (state in _ON_THE_WAY and desired == "ready"):
        return None
    return desired


def replica_view(r: dict) -> dict:
    """A replica's data plus what its row shows: load progress in percent while loading, and its target
    state when that differs from what it is doing (``sleeping → ready``)."""
    return r | {"progress": load_progress(r["state"], r["loaded_bytes"], r["loading_total_bytes"]),
                "toward": heading_for(r["state"], r["desired_state"])}


def deployment_page_data(dep: Deployment) -> dict:
    """Everything the deployment page and its live status fragment show."""
    replicas = replica_rows(dep)
    data = deployment_data(dep, replicas)
    return data | {
        "replicas": [replica_view(r) for r in data["replicas"]],
        "adapters": [a | {"hit_percent": round(100 * a["hits"] / (a["hits"] + a["misses"]))
                          if a["hits"] + a["misses"] else None} for a in data["adapters"]],
        "slo": slo_status(dep),
        "scale": scale_status(dep, replicas),
        "counts": state_counts(replicas),
        "serving": serving_view(dep, replicas),
        "demand": demand_view(dep),
        "idle_after": idle_after(dep),
        "endpoints": sorted({r["endpoint"] for r in data["replicas"] if r["endpoint"]}),
        "adapter_errors": [(r["index"], r["adapter_error"]) for r in data["replicas"] if r["adapter_error"]],
        "log_options": log_options(data["replicas"]),
    }


def log_options(replicas: list[dict]) -> str:
    """What the Worker logs card's replica picker says, in one string: the page sends it back with each status poll,
    and the picker is drawn again only when it changed (a replica added, gone, placed or in another state)."""
    return " ".join(f"{r['index']}:{r['state']}:{r['host'] or ''}" for r in replicas)
