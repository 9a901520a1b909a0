"""Hosts and GPUs as plain data, for the API and the dashboard alike."""

from __future__ import annotations

from django.db.models import Count, F, FloatField, Prefetch, Q, QuerySet, Sum
from django.db.models.functions import Cast

from agent.engines import BUILTIN
from console.accounts.scope import TeamScope
from console.deployments.models import Replica
from console.fleet import lifecycle
from console.fleet.labels import gpu_labels
from console.fleet.models import Gpu, Host

HOST_STATES = lifecycle.STATES
# Host columns no listing shows (the desired state pushed to it can be kilobytes) and deployment columns a
# replica on a GPU does not need (only its name is shown).
_UNSHOWN_HOST_FIELDS = ("desired", "desired_digest", "serving")
_REPLICA_DEPLOYMENT_FIELDS = ("deployment__estimates", "deployment__gateway_stats", "deployment__reason",
                              "deployment__demand_reason", "deployment__selector")


def in_state(hosts: QuerySet, state: str) -> QuerySet:
    """The hosts of `hosts` whose lifecycle is `state` (one of HOST_STATES)."""
    return hosts.filter(lifecycle.where(state))


def fleet(hosts: QuerySet | None, scope: TeamScope) -> list[dict]:
    """Each host of `hosts` (default: all) with its GPUs and the replicas reserved on each GPU, its labels,
    the room it reports for sleeping replicas and the replicas asleep in its memory: five queries for any
    number of hosts. Hosts are every team's; their replicas are as `scope` may see them (TeamScope.replica)."""
    # Asked to sleep but stopped instead (vLLM cannot sleep on CPU) holds nothing in host memory.
    asleep = Replica.objects.filter(Q(observed_state="sleeping") | Q(desired_state="sleeping") & ~Q(
        observed_state="stopped"))
    on_gpu = Replica.objects.select_related("deployment").defer(*_REPLICA_DEPLOYMENT_FIELDS).order_by("pk")
    hosts = (Host.objects.all() if hosts is None else hosts).defer(*_UNSHOWN_HOST_FIELDS).prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.order_by("index")),
        Prefetch("gpus__replicas", queryset=on_gpu),
        Prefetch("replicas", queryset=asleep.select_related("deployment").defer(*_REPLICA_DEPLOYMENT_FIELDS)
                 .order_by("deployment__name", "index"), to_attr="asleep"),
    )
    return [
        {
            "name": h.name,
            "endpoint": h.endpoint,
            "connected": h.connected,
            "state": h.lifecycle,
            "unknown_since": h.unknown_since,
            "evicted_at": h.evicted_at,
            "last_seen": h.last_seen,
            "agent_version": h.agent_version,
            "generation": h.generation,
            "acked_generation": h.acked_generation,
            "labels": h.labels or {},
            "taints": h.taints or {},
            "engines": h.engines or {BUILTIN.name: ""},
            "ram_free_bytes": h.ram_free_bytes,
            "asleep": [
                scope.replica({"deployment": r.deployment.name, "team": r.deployment.team_id, "index": r.index,
                               "state": r.observed_state, "desired_state": r.desired_state,
                               "host_bytes": r.host_bytes})
                for r in h.asleep
            ],
            "gpus": [_gpu(g, scope) for g in h.gpus.all()],
        }
        for h in hosts
    ]


def _gpu(g, scope: TeamScope) -> dict:
    replicas = [scope.replica({
            "deployment": r.deployment.name,
            "team": r.deployment.team_id,
            "index": r.index,
            "state": r.observed_state,
            "desired_state": r.desired_state,
            "action": r.action,
            "reason": r.reason,
            "observed_reason": r.observed_reason,
            "mps_percentage": r.mps_percentage,
            "reserved_bytes": r.reserved_bytes,
            "measured_bytes": r.measured_bytes,
            "loaded_bytes": r.loaded_bytes,
            "loading_total_bytes": r.loading_total_bytes,
        })
        for r in g.replicas.all()
    ]
    reserved = sum(r["reserved_bytes"] for r in replicas)
    return {
        "index": g.index,
        "name": g.name,
        "short_name": gpu_short_name(g.name),
        "uuid": g.uuid,
        "labels": gpu_labels(g),
        "total_bytes": g.total_bytes,
        "used_bytes": g.used_bytes,
        "own_bytes": g.own_bytes,
        "free_bytes": g.free_bytes,
        "reserved_bytes": reserved,
        "utilization": g.utilization,
        "simulated": g.simulated,
        "replicas": replicas,
    }


# Words that name the maker or the family, not the GPU: a grid cell has room for what tells GPUs apart.
_GPU_NAME_PREFIXES = ("NVIDIA ", "GeForce ", "Tesla ", "AMD ", "Radeon ", "Simulated GPU ")
GPU_NAME_CHARS = 24  # the most a GPU's short name takes on the grid (its full name is its title)


def gpu_short_name(name: str) -> str:
    """A GPU's name as the grid shows it: the maker's words dropped ("NVIDIA H100 80GB HBM3" is "H100 80GB
    HBM3", "Simulated GPU 24 GiB" is "24 GiB": its pill says simulated), cut after a whole word past
    GPU_NAME_CHARS."""
    short = name.strip()
    while (prefix := next((p for p in _GPU_NAME_PREFIXES if short.startswith(p) and len(short) > len(p)), None)):
        short = short[len(prefix):].lstrip()
    if len(short) <= GPU_NAME_CHARS:
        return short
    cut = short[:GPU_NAME_CHARS].rsplit(" ", 1)[0] if " " in short[:GPU_NAME_CHARS] else short[:GPU_NAME_CHARS]
    return cut.rstrip(" -_") + "…"


# The order states are shown in: most useful first, as on a deployment's row.
REPLICA_STATE_ORDER = ("ready", "preloaded", "loading", "starting", "pending", "sleeping", "stopped", "failed")
DEPLOYMENT_STATE_ORDER = ("ready", "loading", "pending", "degraded", "failed", "unschedulable")


def _ordered(counts: dict[str, int], order: tuple[str, ...]) -> list[tuple[str, int]]:
    known = [(s, counts[s]) for s in order if counts.get(s)]
    return known + sorted((s, n) for s, n in counts.items() if s not in order and n)


def float_sum(expression) -> Sum:
    """A sum of byte counts that cannot overflow: SQLite fails a 64-bit integer SUM past 2**63 ("integer overflow"),
    which a few dozen hosts of the largest GPUs the protocol allows reach, or rows stored under older bounds."""
    return Sum(Cast(F(expression) if isinstance(expression, str) else expression, FloatField()))


def _whole(value) -> int:
    return int(value or 0)


def fleet_summary(scope: TeamScope) -> dict:
    """The fleet in figures, whatever page is shown: hosts by state, GPUs and their memory (shared by every team:
    the whole fleet's), and the replicas by observed state and deployments by state that `scope` sees. Five
    aggregate queries, however large the fleet."""
    # Aliases unlike any field name: Django refuses an aggregate named "connected".
    hosts = Host.objects.aggregate(n_total=Count("pk"),
                                   **{f"n_{s}": Count("pk", filter=lifecycle.where(s)) for s in HOST_STATES})
    gpus = Gpu.objects.aggregate(n_count=Count("pk"), n_simulated=Count("pk", filter=Q(simulated=True)),
                                 n_total_bytes=float_sum("total_bytes"), n_used_bytes=float_sum("used_bytes"))
    gpus = {k.removeprefix("n_"): v for k, v in gpus.items()}
    # As each GPU's bar counts it: a replica's reservation on every GPU it spans.
    reserved = _whole(Replica.gpus.through.objects.aggregate(b=float_sum("replica__reserved_bytes"))["b"])
    theirs = scope.deployments().order_by()
    replicas = dict(scope.replicas().order_by().values_list("observed_state").annotate(n=Count("pk")))
    deployments = dict(theirs.values_list("state").annotate(n=Count("pk")))
    violating = theirs.filter(violating=True).count()
    total_bytes, used_bytes = _whole(gpus["total_bytes"]), _whole(gpus["used_bytes"])
    return {
        "hosts": {"total": hosts["n_total"], "states": [(s, hosts[f"n_{s}"]) for s in HOST_STATES]},
        "gpus": {"count": gpus["count"], "simulated": gpus["simulated"]},
        "memory": {"total_bytes": total_bytes, "reserved_bytes": reserved, "used_bytes": used_bytes,
                   "reserved_pct": round(100 * reserved / total_bytes, 1) if total_bytes else 0.0,
                   "used_pct": round(100 * used_bytes / total_bytes, 1) if total_bytes else 0.0},
        "replicas": {"total": sum(replicas.values()), "states": _ordered(replicas, REPLICA_STATE_ORDER)},
        "deployments": {"total": sum(deployments.values()), "states": _ordered(deployments, DEPLOYMENT_STATE_ORDER),
                        "violating": violating},
        "teams_only": not scope.everything,  # replicas and deployments are the viewer's teams' only
    }
