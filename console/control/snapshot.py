"""Database rows as the pure scheduler's input types (console/scheduler): plain values, read once a pass."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from console.carried import CarriedRows
from console.deployments.models import Deployment, Replica
from console.fleet import lifecycle
from console.fleet.labels import labels_of
from console.fleet.models import Gpu, Host, foreign_bytes
from console.scheduler import Deployment as DeploymentSpec
from console.scheduler import Gpu as GpuSpec
from console.scheduler import Host as HostSpec
from console.scheduler import Replica as ReplicaSpec
from console.scheduler.engines import engine_labels, engine_selector


@dataclass(frozen=True)
class GpuRow:
    """A schedulable GPU as the pass writes placements onto it (a plain row, not a model instance)."""

    pk: int
    id: str  # "host/index", the scheduler's name for it
    host_id: int
    simulated: bool


@dataclass(slots=True)
class DeploymentRow:
    """A deployment as a pass reads it: plain values of the fields it plans with and writes (each named as on the
    model), not a model instance: building 10,000 instances, every field's default filled and then overwritten,
    was a quarter of a pass that changed nothing."""

    pk: int
    name: str
    replicas: int
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int
    priority: str
    selector: dict
    slo_latency_ms: int | None
    latency_critical: bool
    profile: str
    standby: bool
    traffic_rps: float
    observed_p95_ms: float | None
    violating: bool
    status_since: datetime | None
    last_scale_at: datetime | None
    last_request_at: datetime | None
    created: datetime | None
    demand: int
    demand_at: datetime | None
    demand_since: datetime | None
    idle_timeout_s: int
    demand_status: str
    demand_reason: str
    engine: str
    tolerations: dict
    spread: str
    team_id: int  # the scheduler's reasons name another team's replicas without their names


_DEPLOYMENTS = CarriedRows(Deployment, tuple(DeploymentRow.__dataclass_fields__), ("name",))


def deployment_rows() -> list[DeploymentRow]:
    """Every deployment, as a pass reads it, by name (the order the planner is given them)."""
    return [DeploymentRow(*row) for row in _DEPLOYMENTS.read()]


@dataclass(slots=True)
class ReplicaRow:
    """A replica row as a pass reads and writes it: plain values of the fields it plans with, like DeploymentRow,
    its changes written back by key (new rows are model instances)."""

    pk: int
    deployment_id: int
    index: int
    last_request_at: datetime | None
    host_id: int | None
    desired_state: str
    reserved_bytes: int
    reservation: dict
    reason: str
    action: str
    mps_percentage: int | None
    ready_since: datetime | None
    observed_state: str
    measured_bytes: int | None
    pid: int | None


_REPLICAS = CarriedRows(Replica, tuple(ReplicaRow.__dataclass_fields__), ("deployment_id", "index"))


def replica_rows() -> list[ReplicaRow]:
    """Every replica row, as a pass reads it, by deployment and index."""
    return [ReplicaRow(*row) for row in _REPLICAS.read()]


def gpu_id(host: str, index: int) -> str:
    """The scheduler's name for a GPU."""
    return f"{host}/{index}"


def gpu_names() -> dict[int, str]:
    """Every GPU's scheduler name by primary key (a replica's GPUs may be on a host that is gone)."""
    return {pk: gpu_id(host, index) for pk, host, index in Gpu.objects.order_by().values_list("pk", "host__name",
                                                                                              "index")}


def schedulable_hosts():
    """Hosts whose GPUs the plan sees: connected ones, and unknown ones not yet evicted (they keep their
    replicas: a host that missed a few heartbeats, or a console that restarted, moves nothing)."""
    return Host.objects.filter(lifecycle.where(lifecycle.CONNECTED, lifecycle.UNKNOWN))


def gpu_specs(buffer_bytes: int, replicas: Iterable[ReplicaRow], gpus_of: dict[int, list[int]],
              heard_since: datetime | None = None) -> tuple[list[GpuSpec], dict[str, GpuRow]]:
    """Schedulable GPUs, with the memory other processes use on them. `replicas` are every replica row and
    `gpus_of` their GPUs' primary keys (the pass reads both once). GPUs of hosts that are unknown, or whose
    agent has not spoken since `heard_since` (when this scheduler began leading), are stale: their readings
    are from before, so the plan holds their replicas as they are and puts nothing new there."""
    on_gpu: dict[int, list[ReplicaRow]] = {}
    for r in replicas:
        for g in gpus_of.get(r.pk, ()):
            on_gpu.setdefault(g, []).append(r)
    rows = (Gpu.objects.filter(host__in=schedulable_hosts())
            .values_list("pk", "index", "name", "total_bytes", "used_bytes", "own_bytes", "simulated", "host_id",
                         "host__name", "host__connected", "host__labels", "host__last_seen", "host__engines",
                         "host__taints"))
    specs, by_id = [], {}
    for pk, index, name, total, used, own, simulated, host_id, host, connected, labels, seen, engines, taints in rows:
        here = on_gpu.get(pk, ())
        # What our own workers hold is ours, the rest of the reading is foreign. The agent says what its workers
        # hold, draining and loading ones included (their rows may already point elsewhere); an agent that does not
        # say is credited with what its ready replicas here measured. A reading never replaces a reservation:
        # reservations come from the replica rows alone.
        foreign = foreign_bytes(used, own, sum(r.measured_bytes or 0 for r in here if r.observed_state == "ready")
                                if own is None else 0)
        stale = not connected or (heard_since is not None and seen is not None and seen < heard_since)
        gid = gpu_id(host, index)
        specs.append(GpuSpec(id=gid, host=host, total_bytes=total, used_bytes=foreign,
                             labels=labels_of(name, labels) | engine_labels(engines), taints=taints or {},
                             stale=stale))
        by_id[gid] = GpuRow(pk, gid, host_id, simulated)
    return specs, by_id


def host_specs() -> tuple[HostSpec, ...]:
    """Schedulable hosts with the host RAM they report free for sleeping replicas (None: unknown); an
    unknown host keeps its sleeping replicas but gets no more."""
    # Plain values: a Host instance decodes every field (its serving figures, its labels), a quarter second a pass
    # at 1,000 hosts for the two figures read here.
    return tuple(HostSpec(name, free if connected else 0)
                 for name, free, connected in schedulable_hosts().values_list("name", "ram_free_bytes", "connected"))


def _unix(when) -> float | None:
    return None if when is None else when.timestamp()


def live_demand(dep: Deployment | DeploymentRow, now: float, stale_s: float) -> int:
    """Requests waiting at a gateway for a ready replica; a count its gateway stopped renewing is stale."""
    if not dep.demand or dep.demand_at is None or now - dep.demand_at.timestamp() > stale_s:
        return 0
    return dep.demand


def ready_count(replicas: Iterable[ReplicaRow], fresh_hosts: set[int]) -> int:
    """Replicas the gateway can route to: meant to be ready, reported ready, on a host whose readings are fresh.
    Requests that wait while some are ready are backed up behind them (the scheduler adds one more)."""
    return sum(1 for r in replicas if r.desired_state == "ready" and r.observed_state == "ready"
               and r.host_id in fresh_hosts)


def deployment_spec(dep: Deployment | DeploymentRow, replica_bytes: int, now: float = 0.0, demand_stale_s: float = 5.0,
                    ready_replicas: int = 0) -> DeploymentSpec:
    """A deployment with its calibrated bytes per replica, what was observed of it (`ready_replicas`: ready_count),
    and its demand."""
    last = _unix(dep.last_request_at)
    created = _unix(dep.created)
    return DeploymentSpec(
        name=dep.name,
        bytes=replica_bytes,
        replicas=dep.replicas,
        min_replicas=dep.min_replicas,
        max_replicas=max(dep.max_replicas, dep.min_replicas),
        gpus_per_replica=dep.gpus_per_replica,
        priority=dep.priority,
        selector=dict(dep.selector or {}) | engine_selector(dep.engine),
        tolerations=dict(dep.tolerations or {}),
        spread=dep.spread,
        slo_latency_ms=dep.slo_latency_ms,
        latency_critical=dep.latency_critical,
        profile=dep.profile or None,
        traffic_rps=dep.traffic_rps,
        observed_latency_ms=dep.observed_p95_ms,
        violating=dep.violating if dep.slo_latency_ms else None,
        status_since=dep.status_since.timestamp() if dep.status_since else None,
        last_scale_at=dep.last_scale_at.timestamp() if dep.last_scale_at else None,
        demand=live_demand(dep, now, demand_stale_s),
        ready_replicas=ready_replicas,
        team=dep.team_id,
        demand_since=_unix(dep.demand_since),
        idle_timeout_s=float(dep.idle_timeout_s) if dep.idle_timeout_s else None,
        active_at=max(t for t in (last, created) if t is not None) if (last or created) else None,
    )


def replica_specs(deployments: list[DeploymentRow], rows: dict[int, list[ReplicaRow]], gpu_ids: dict[int, list[str]],
                  host_names: dict[int, str]) -> tuple[ReplicaSpec, ...]:
    """Replicas that exist: ready ones with their GPUs (the plan moves those whose GPUs are gone or
    full), sleeping ones on their host. Rows without a host are not placed yet. `rows` are each deployment's
    replica rows, `gpu_ids` each replica's GPUs by scheduler name."""
    specs = []
    for dep in deployments:
        for r in rows.get(dep.pk, ()):
            used, since = _unix(r.last_request_at), _unix(r.ready_since)
            if r.desired_state == "sleeping" and r.host_id is not None:
                specs.append(ReplicaSpec(dep.name, r.index, (), 0, "sleeping", host_names[r.host_id],
                                         last_request_at=used, ready_since=since))
            elif r.host_id is not None:  # ready or preloaded (standby): either holds its GPUs
                specs.append(ReplicaSpec(dep.name, r.index, tuple(gpu_ids.get(r.pk, ())), r.reserved_bytes,
                                         "ready", last_request_at=used, ready_since=since,
                                         mps_percentage=r.mps_percentage))
    return tuple(specs)
