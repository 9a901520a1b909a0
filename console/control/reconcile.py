"""One pass of the control loop: snapshot the database into the pure scheduler's types, plan, apply the
plan to the replica rows, and compute each host's desired state. Level-triggered: every pass looks at
the whole database, so a missed pass or a lost message is repaired by the next one."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from console.bulk import insert, lock_rows, update_fields_by_pk
from console.carried import CarriedRows, forget_all
from console.catalog.memory import Reservation, corrections, deployment_estimates, reservation
from console.catalog.models import DeviceKind
from console.control.desired import bump_generations
from console.control.leases import advance
from console.control.observed import refresh_observations
from console.control.rollout import roll
from console.control.snapshot import (
    DeploymentRow,
    GpuRow,
    ReplicaRow,
    deployment_rows,
    deployment_spec,
    gpu_names,
    gpu_specs,
    host_specs,
    live_demand,
    ready_count,
    replica_rows,
    replica_specs,
)
from console.control.states import refresh_deployment_states
from console.deployments.models import Deployment, Replica
from console.deployments.rowlocks import hold_existing
from console.errors import Invalid
from console.events.record import Note, deployment_object, record, replica_object
from console.fleet.models import Host, PlacementSettings
from console.scheduler import PlanInput, PlannedReplica, Settings, plan
from console.scheduler.explain import gib
from console.scheduler.horizon import next_change

log = logging.getLogger("modelgrid.scheduler")
Scope = Literal["plan", "states", "tick"]  # what a pass does: reconcile_once
# Every host's desired state is rebuilt this often besides those a pass changed (at 1,000 hosts a rebuild of all
# costs about as much as a pass).
DESIRED_SWEEP_SECONDS = 60.0
LOGGED_ACTIONS = 20  # a pass's actions logged a line each; the rest are counted in one (_log_actions)


@dataclass(frozen=True)
class PassResult:
    changed_hosts: tuple[int, ...]  # host ids whose desired state got a new generation
    changed: bool  # anything at all changed (replicas created, placed, states)
    # The plan's own inputs or outcome changed (replicas, hosts, observations, not just deployments' derived
    # states): another pass should see it through. Deployments' states are no input of the plan.
    replanned: bool = False
    actions: tuple[str, ...] = ()  # the scheduler's actions that changed a replica (place, wake, ...)
    events: int = 0  # events this pass appended to the timeline
    # Per changed host, its new generation and its desired replicas' JSON text, for the push to send as it is.
    states: dict[int, tuple[int, str]] = field(default_factory=dict, compare=False, repr=False)
    cpu_s: float = 0.0  # the pass's own CPU time (its wall time also counts waits for locks and the GIL)
    behind: tuple[int, ...] = ()  # connected hosts that have not acknowledged their current generation
    refused: tuple[str, ...] = ()  # the tier of each replica that became refused a place (scaled to zero is no refusal)
    preempted: tuple[str, ...] = ()  # the tier of each replica this pass preempted
    planned: bool = True  # False: a tick or a "states" pass (reconcile_once's scope): nothing was planned
    # When planning the same rows again could decide differently by the clock alone (unix time; None: never), and
    # whether any deployment has traffic or requests waiting (its figures move without waking the scheduler).
    recheck_at: float | None = None
    busy: bool = False


def fleet_device_kind(gpus: dict[str, GpuRow]) -> str:
    """Where replicas will run: "cpu" when every schedulable GPU is simulated (workers then run on the
    host's CPU and measure CPU memory), else "cuda"."""
    return DeviceKind.CPU if gpus and all(g.simulated for g in gpus.values()) else DeviceKind.CUDA


@dataclass
class _Rows:
    """What a pass reads, once and without per-row queries: every replica row by deployment, each replica's
    GPUs (primary keys and scheduler names) and every host's name."""

    by_deployment: dict[int, list[ReplicaRow]]
    gpus_of: dict[int, list[int]]  # replica pk -> GPU pks
    gpu_ids: dict[int, list[str]]  # replica pk -> sorted "host/index"
    host_names: dict[int, str]
    host_ids: dict[str, int]

    @classmethod
    def read(cls) -> _Rows:
        by_deployment: dict[int, list[ReplicaRow]] = {}
        for r in replica_rows():
            by_deployment.setdefault(r.deployment_id, []).append(r)
        names = gpu_names()
        gpus_of: dict[int, list[int]] = {}
        for replica_id, gpu in Replica.gpus.through.objects.values_list("replica_id", "gpu_id"):
            gpus_of.setdefault(replica_id, []).append(gpu)
        gpu_ids = {r: sorted(names[g] for g in gs) for r, gs in gpus_of.items()}
        host_names = dict(Host.objects.values_list("pk", "name"))
        return cls(by_deployment, gpus_of, gpu_ids, host_names, {n: pk for pk, n in host_names.items()})

    def all(self) -> list[ReplicaRow]:
        return [r for rows in self.by_deployment.values() for r in rows]


_ESTIMATES: dict[str, CarriedRows] = {}  # by device kind


def _estimates(device: str) -> CarriedRows:
    """Each deployment's (pk, total bytes, family) on `device`: only the two figures of the stored breakdown a
    reservation needs, extracted by the database (decoding every deployment's whole breakdown was a fifth of a
    10,000-replica pass). Spelled as expressions, not as "estimates__cuda__total_bytes": Django resolves such a path
    by catching the FieldError of a field named "cuda" and keeping it in a local, a cycle through the traceback that
    held every frame of the pass, with the whole plan, until the cyclic collector came (250,000 objects a pass at
    1,000 hosts)."""
    if device not in _ESTIMATES:
        breakdown = KeyTransform(device, "estimates")
        _ESTIMATES[device] = CarriedRows(Deployment, ("pk", "total", "family"), ("pk",),
                                         total=KeyTransform("total_bytes", breakdown),
                                         family=KeyTransform("family", breakdown))
    return _ESTIMATES[device]


def _reservations(deployments: list[DeploymentRow], device: str) -> tuple[dict[int, Reservation], dict[int, str]]:
    """The calibrated bytes one replica of each deployment reserves on `device`, and why any cannot
    be estimated (a model directory that went missing or changed since registration)."""
    needs, problems = {}, {}
    by_family = corrections(device)
    stored = {pk: (total, family) for pk, total, family in _estimates(device).read()}
    made: dict[tuple[int, str], Reservation] = {}  # most deployments share a few estimates: each made once
    for dep in deployments:
        try:
            total, family = stored.get(dep.pk, (None, None))
            if total is None:  # a row from before estimates were stored per deployment
                row = Deployment.objects.filter(pk=dep.pk).first()
                if row is None:  # deleted since the pass read it: nothing to plan
                    continue
                row.estimates = deployment_estimates(row)
                row.save(update_fields=["estimates"])
                total, family = row.estimates[device]["total_bytes"], row.estimates[device]["family"]
            if (total, family) not in made:
                made[total, family] = reservation({device: {"total_bytes": total, "family": family}}, device,
                                                  by_family)
            needs[dep.pk] = made[total, family]
        except Invalid as e:
            problems[dep.pk] = f"cannot estimate its memory: {e}"
    return needs, problems


class _Planned(NamedTuple):
    changed: bool
    recheck_at: float | None  # next_change of the plan's input
    busy: bool  # a deployment has traffic, a latency figure or requests waiting


def _plan_and_apply(now: datetime, actions: list[str], touched: set[int], setbacks: list[tuple[str, str]],
                    notes: list[Note]) -> _Planned:
    """Plan every deployment on the schedulable GPUs and write the outcome onto the replica rows; `touched`
    collects the hosts whose replicas changed (their desired state is rebuilt), `setbacks` (action, tier) of each
    replica that became refused or preempted, `notes` the events of what changed."""
    # Plain reads, a handful of queries whatever the fleet's size: plain values, no model instances, no
    # prefetching (a queryset per row costs more than the rows). (A deployment's model is read only when its
    # estimates must be rebuilt; the gateway's figures are folded in by refresh_observations.)
    deployments = deployment_rows()
    rows = _Rows.read()
    specs, gpus = gpu_specs(settings.MODELGRID_GPU_BUFFER_BYTES, rows.all(), rows.gpus_of, _leading_since_wall)
    device = fleet_device_kind(gpus)
    needs, problems = _reservations(deployments, device)
    changed = False
    writes = _Writes()
    for dep in deployments:
        if dep.pk in problems:
            if _ensure_rows(dep, rows.by_deployment.get(dep.pk, []), problems[dep.pk], writes):
                changed = True
                notes.append(Note(deployment_object(dep.name), "CannotEstimate", problems[dep.pk], warning=True,
                                  actor="scheduler", deployment=dep.name))
    planned = [d for d in deployments if d.pk in needs]
    fresh = {gpus[g.id].host_id for g in specs if not g.stale}
    request = PlanInput(
        gpus=tuple(specs),
        deployments=tuple(deployment_spec(d, needs[d.pk].bytes, now.timestamp(),
                                          settings.MODELGRID_DEMAND_STALE_SECONDS,
                                          ready_count(rows.by_deployment.get(d.pk, ()), fresh)) for d in planned),
        replicas=replica_specs(planned, rows.by_deployment, rows.gpu_ids, rows.host_names),
        hosts=host_specs(),
        strategy=PlacementSettings.strategy_now()[0],
        buffer_bytes=settings.MODELGRID_GPU_BUFFER_BYTES,
        now=now.timestamp(),
        settings=Settings(quiet_window_s=settings.MODELGRID_QUIET_WINDOW_SECONDS,
                          cooldown_s=settings.MODELGRID_SCALE_COOLDOWN_SECONDS,
                          search_budget_s=settings.MODELGRID_SEARCH_BUDGET_SECONDS,
                          idle_grace_s=settings.MODELGRID_IDLE_GRACE_SECONDS,
                          min_residency_s=settings.MODELGRID_MIN_RESIDENCY_SECONDS),
    )
    result = plan(request)
    by_name = {d.name: d for d in planned}
    # Deployment rows are written in key order, as every writer of several of them takes their locks.
    for decision in sorted(result.scale, key=lambda d: by_name[d.deployment].pk):
        dep = by_name[decision.deployment]
        if decision.target != dep.replicas:
            notes.append(Note(deployment_object(dep.name), "Scaled", f"scaled from {dep.replicas} to "
                              f"{decision.target} replicas: {decision.reason}", actor="scheduler", deployment=dep.name))
            dep.replicas, dep.last_scale_at = decision.target, now
            Deployment.objects.filter(pk=dep.pk).update(replicas=dep.replicas, last_scale_at=now)
            changed = True
    planned_rows: dict[str, set[int]] = {}
    indexed = {dep.pk: {r.index: r for r in rows.by_deployment.get(dep.pk, ())} for dep in planned}
    applied: list[tuple[int, str, bool]] = []  # (deployment, action, a setback) of each replica that changed
    for p in result.replicas:
        dep = by_name[p.deployment]
        planned_rows.setdefault(p.deployment, set()).add(p.index)
        was = getattr(indexed[dep.pk].get(p.index), "action", "")
        if _apply(dep, indexed[dep.pk], p, gpus, needs[dep.pk], device, now, touched, rows, writes, notes):
            changed = True
            setback = p.action in ("refuse", "preempt") and p.action != was and "scaled to zero" not in p.reason
            applied.append((dep.pk, p.action, setback))
    for dep in planned:  # rows the plan no longer mentions: scaled away
        gone = [r for r in indexed[dep.pk].values() if r.index not in planned_rows.get(dep.name, set())]
        if gone:
            touched.update(r.host_id for r in gone if r.host_id)
            writes.dropped.extend(gone)
            changed = True
    deleted = writes.write()
    if deleted:  # since the rows were read: what was planned for them was not written, so it is not told either
        names = {d.name for d in deployments if d.pk in deleted}
        notes[:] = [n for n in notes if n.deployment not in names]
    tiers = {d.pk: d.priority for d in planned}
    for pk, action, setback in applied:
        if pk in deleted:
            continue
        if action != "keep":
            actions.append(action)
        if setback:
            setbacks.append((action, tiers[pk]))
    answers = {d.deployment: d for d in result.outlooks} | {d.deployment: d for d in result.demands}
    changed |= _answer_demand(sorted(deployments, key=lambda d: d.pk), answers, now, rows)
    busy = any(d.traffic_rps or d.observed_p95_ms is not None or d.demand for d in deployments)
    recheck = next_change(request)
    if any(g.stale for g in request.gpus):  # a host that speaks is fresh then, and nothing wakes a pass for that
        recheck = min(recheck, now.timestamp()) if recheck is not None else now.timestamp()
    return _Planned(changed, recheck, busy)


def _answer_demand(deployments: list[DeploymentRow], outcomes: dict, now: datetime, rows: _Rows) -> bool:
    """Write the scheduler's answer to each deployment's waiting requests where the gateway reads it. A
    deployment without demand has no answer (so an old refusal never meets new requests), unless a request would
    be refused now: "blocked", which its pages show and the gateway leaves to the answer its requests get."""
    changed = False
    stale_s = settings.MODELGRID_DEMAND_STALE_SECONDS
    for dep in deployments:
        outcome = outcomes.get(dep.name)
        status, reason = (outcome.status, outcome.reason) if outcome else ("", "")
        if status == "served":
            reason = _not_serving_yet(dep.name, rows.by_deployment.get(dep.pk, ()), rows.host_names) or reason
        if outcome is None and live_demand(dep, now.timestamp(), stale_s):
            continue  # demand the planner did not see (the deployment could not be estimated): leave it
        if (dep.demand_status, dep.demand_reason) != (status, reason):
            dep.demand_status, dep.demand_reason = status, reason
            Deployment.objects.filter(pk=dep.pk).update(demand_status=status, demand_reason=reason)
            changed = True
    return changed


_NOT_YET = {"pending": "waits for its agent to start it", "starting": "is starting", "loading": "is loading"}


def _not_serving_yet(name: str, replicas, host_names: dict[int, str]) -> str:
    """What the requests for `name` wait on when the plan serves it from replicas that were already placed to serve
    but none of which its agent reports ready (the scheduler's "ready on h/0" is its plan, not what runs): a failed
    one's failure, else the state of one on its way; "" when one serves, or none was placed before this pass."""
    placed = [r for r in replicas if r.host_id is not None and r.desired_state == "ready"]
    if not placed or any(r.observed_state == "ready" for r in placed):
        return ""
    failed = next((r for r in placed if r.observed_state == "failed"), None)
    if failed is not None:
        why = Replica.objects.filter(pk=failed.pk).values_list("observed_reason", flat=True).first()
        return (f"its replica {name}#{failed.index} on {host_names.get(failed.host_id, '?')} failed: "
                f"{why or 'its agent gave no reason'} (its agent restarts it)")
    coming = next((r for r in placed if r.observed_state in _NOT_YET), None)
    if coming is None:
        return ""
    where = host_names.get(coming.host_id, "?")
    return f"its replica {name}#{coming.index} on {where} {_NOT_YET[coming.observed_state]}"


def _ensure_rows(dep: DeploymentRow, existing: list[ReplicaRow], reason: str, writes: _Writes) -> bool:
    """A deployment the scheduler cannot plan: its replicas wait unplaced, saying why (written with the plan's)."""
    rows = {r.index: r for r in existing}
    changed = False
    for index in range(dep.replicas):
        row = rows.get(index)
        if row is None:
            writes.born.append((Replica(deployment_id=dep.pk, index=index, reason=reason), []))
        elif row.reason != reason:
            row.reason = reason
            writes.changed.append((row, ["reason"]))
        else:
            continue
        changed = True
    return changed


@dataclass
class _Writes:
    """What a pass writes to replica rows, collected while it applies the plan and written after in a few
    statements, however many rows (at 1,000 hosts a statement per row was 8 of a 14 s pass)."""

    born: list[tuple[Replica, list[int]]] = field(default_factory=list)  # new rows, their GPUs' keys
    changed: list[tuple[ReplicaRow, list[str]]] = field(default_factory=list)  # rows, the fields that changed
    regpu: list[tuple[ReplicaRow, list[int]]] = field(default_factory=list)  # rows on other GPUs now
    dropped: list[ReplicaRow] = field(default_factory=list)  # rows to delete

    def write(self) -> set[int]:
        """Write it all; returns the deployments deleted since the pass read them, for which nothing was written."""
        # Their deployments are held first (console/deployments/rowlocks.py): a deployment deleted meanwhile gets no
        # rows (they would fail this pass's commit), and one deleted later takes these rows along.
        rows = [r for r, _ in self.born] + [r for r, _ in self.changed] + [r for r, _ in self.regpu] + self.dropped
        wanted = {r.deployment_id for r in rows}
        deleted = wanted - hold_existing(wanted)
        if deleted:
            self.born = [(r, gpus) for r, gpus in self.born if r.deployment_id not in deleted]
            self.changed = [(r, fields) for r, fields in self.changed if r.deployment_id not in deleted]
            self.regpu = [(r, gpus) for r, gpus in self.regpu if r.deployment_id not in deleted]
            self.dropped = [r for r in self.dropped if r.deployment_id not in deleted]
        # Every existing row written below is locked first, in one sweep in key order as intake locks them
        # (console/intake/stages.py), so the writes may take them in any order (update_fields_by_pk's own lock then
        # finds its rows already held).
        lock_rows(Replica, [r.pk for r, _ in self.changed] + [r.pk for r, _ in self.regpu]
                  + [r.pk for r in self.dropped])
        update_fields_by_pk(Replica, self.changed)
        through = Replica.gpus.through
        if self.regpu:
            through.objects.filter(replica_id__in=[row.pk for row, _ in self.regpu]).delete()
            insert([through(replica_id=row.pk, gpu_id=g) for row, gpu_pks in self.regpu for g in gpu_pks])
        if self.dropped:
            Replica.objects.filter(pk__in=[r.pk for r in self.dropped]).delete()
        if self.born:  # new rows and their GPU links in two statements, however many deployments are new
            insert([row for row, _ in self.born])
            keys = {(row.deployment_id, row.index): gpu_pks for row, gpu_pks in self.born}
            created = Replica.objects.filter(deployment_id__in={d for d, _ in keys}).values_list(
                "deployment_id", "index", "pk")
            insert([through(replica_id=pk, gpu_id=g) for dep, index, pk in created for g in keys.get((dep, index), ())])
        return deleted


# The fields a pass owns on a replica row (intake owns the observed ones, which a move resets).
_PLANNED = ("host_id", "desired_state", "reserved_bytes", "reservation", "reason", "action", "mps_percentage",
            "ready_since")
_OBSERVED = ("observed_state", "measured_bytes", "pid")
_DESIRED = {"host", "desired_state", "reserved_bytes", "mps_percentage"}  # what a host's desired state shows


def _apply(dep: DeploymentRow, rows: dict[int, ReplicaRow], p: PlannedReplica, gpus: dict[str, GpuRow],
           need: Reservation, device: str, now: datetime, touched: set[int], read: _Rows, writes: _Writes,
           notes: list[Note]) -> bool:
    """Apply one planned replica to its row, collecting what to write in `writes`; True if anything changed. Only
    the fields that changed are written, so a steady pass writes nothing and never overwrites what intake just
    stored."""
    row = rows.get(p.index)
    if p.action == "stop" and p.index >= dep.replicas:
        if row is not None:
            touched.update(h for h in (row.host_id,) if h)
            writes.dropped.append(row)
        return row is not None
    host_before = row.host_id if row is not None else None
    if row is None:
        row = Replica(deployment_id=dep.pk, index=p.index)
    before = {f: getattr(row, f) for f in _PLANNED + _OBSERVED}
    had = read.gpu_ids.get(row.pk, []) if row.pk else []
    row.reason, row.action, row.mps_percentage = p.reason, p.action, p.mps_percentage
    placement: list[GpuRow] = []
    if p.state == "ready" and p.gpus:
        placement = [gpus[g] for g in p.gpus]
        moved = row.host_id != placement[0].host_id or had != list(p.gpus)
        if moved:
            row.observed_state, row.measured_bytes, row.pid = "pending", None, None
        if p.action in ("place", "move", "wake"):
            row.ready_since = now  # its minimum residency on these GPUs counts from here
        grown = row.reserved_bytes
        if moved or p.action in ("place", "move", "wake") or not row.reservation or _grows(row, p, need):
            row.reserved_bytes = p.reserved_bytes
            row.reservation = {"device": device, "estimated_bytes": need.estimated_bytes,
                               "factor": need.correction.factor, "calibrated_from": need.correction.samples}
        if not moved and p.action == "keep" and grown and row.reserved_bytes > grown:
            notes.append(_resized(dep, p, grown, device, read.host_names.get(placement[0].host_id, "")))
        row.host_id, row.desired_state = placement[0].host_id, "preloaded" if dep.standby else "ready"
    elif p.state == "sleeping":
        if p.host:
            row.host_id = read.host_ids[p.host]
        row.desired_state, row.reserved_bytes = "sleeping", 0
    else:  # stopped but still wanted (preempted without room to sleep), or refused: waits unplaced
        row.host_id, row.desired_state, row.reserved_bytes, row.reservation = None, "ready", 0, {}
        row.observed_state, row.pid = "pending", None
    changed = [f.removesuffix("_id") for f in _PLANNED + _OBSERVED if getattr(row, f) != before[f]]
    created = row.pk is None
    regpu = sorted(g.id for g in placement) != had
    if created:
        writes.born.append((row, [g.pk for g in placement]))
    else:
        if changed:
            writes.changed.append((row, changed))
        if regpu:
            writes.regpu.append((row, [g.pk for g in placement]))
    if (created or changed) and p.action != "keep":
        host = read.host_names.get(row.host_id or host_before, "")
        notes.append(Note(replica_object(dep.name, p.index), ACTION_REASONS.get(p.action, p.action.title()), p.reason,
                          warning=p.action in ("preempt", "refuse"), actor="scheduler", deployment=dep.name, host=host))
    if created or regpu or set(changed) & _DESIRED:
        touched.update(h for h in (host_before, row.host_id) if h)
    return created or bool(changed) or regpu


def _grows(row: ReplicaRow | Replica, p: PlannedReplica, need: Reservation) -> bool:
    """Whether a kept replica's reservation grows in place: the plan holds more for it because its deployment's
    estimate grew (adapters added: its worker's pool grows into it), not because calibration moved (a kept row is
    not rewritten for that; the plan reserves the calibrated figure as it is)."""
    return p.reserved_bytes > row.reserved_bytes and row.reservation.get("estimated_bytes") != need.estimated_bytes


def _resized(dep: DeploymentRow, p: PlannedReplica, was: int, device: str, host: str) -> Note:
    """The timeline's word on a reservation grown in place (rare: read the deployment's breakdown for it)."""
    estimates = Deployment.objects.filter(pk=dep.pk).values_list("estimates", flat=True).first() or {}
    pool = (estimates.get(device) or {}).get("adapter_pool_bytes")
    why = f"its adapter pool grew to {gib(pool)}" if pool else "its deployment's estimate grew"
    return Note(replica_object(dep.name, p.index), "Resized", f"reservation grown in place on {', '.join(p.gpus)} "
                f"from {gib(was)} to {gib(p.reserved_bytes)}: {why}; its worker takes the room without a restart",
                actor="scheduler", deployment=dep.name, host=host)


# The timeline's reason code for each of the scheduler's actions.
ACTION_REASONS = {"place": "Placed", "move": "Moved", "wake": "Woken", "sleep": "Slept", "preempt": "Preempted",
                  "stop": "Stopped", "refuse": "Refused"}


_leading_since: float | None = None  # when this process began passing (its reconnect grace counts from then)
_leading_since_wall: datetime | None = None  # the same on the clock leases are written with: hosts not heard since
# then have stale readings (snapshot.gpu_specs)
_last_sweep = float("-inf")


def start_leading() -> None:
    """This process has just become the scheduler: agents get the reconnect grace before any lease lapses,
    and the first pass rebuilds every host's desired state."""
    global _leading_since, _leading_since_wall, _last_sweep
    _leading_since, _leading_since_wall, _last_sweep = time.monotonic(), timezone.now(), float("-inf")
    forget_all()  # nothing read in an earlier term is carried into this one


def _host_lifecycle(now: datetime, notes: list[Note]) -> bool:
    """Leases and evictions (console/control/leases.py), but nothing during the reconnect grace after this process
    began leading: a console restart is not the fleet leaving."""
    if _leading_since is None:
        start_leading()
    if time.monotonic() - _leading_since < settings.MODELGRID_RECONNECT_GRACE_SECONDS:
        return False
    return advance(now, notes)


def reconcile_once(fence: Callable[[], None] | None = None, scope: Scope = "plan") -> PassResult:
    """One pass, committed in one transaction. `fence` runs first inside it: the scheduler leader's check
    that it still leads (it raises to abort the pass, so a deposed leader writes nothing). `scope` "plan" plans
    every deployment; "tick" only lapses leases and evicts hosts, and "states" also derives the deployments' states
    from their replicas' (what changed when agents reported only replicas' states, which the plan does not read);
    either plans after all if a lease or an eviction changed something. At 10,000 replicas a tick costs a few
    queries and a "states" pass a few tenths of a second, where planning costs seconds."""
    global _last_sweep
    began = time.thread_time()
    now = timezone.now()
    actions: list[str] = []
    setbacks: list[tuple[str, str]] = []
    touched: set[int] = set()
    notes: list[Note] = []
    # Leases and evictions first, in a transaction of their own: it locks host rows, and the pass proper takes
    # replica rows before host rows, so it never holds a host row while it waits for a replica row.
    with transaction.atomic():
        if fence is not None:
            fence()
        lifecycle = _host_lifecycle(now, notes)
        record(notes, now)
    events = len(notes)
    notes.clear()
    if scope != "plan" and not lifecycle:
        changed = False
        if scope == "states":
            with transaction.atomic():
                if fence is not None:
                    fence()
                changed = refresh_deployment_states()
        return PassResult(changed_hosts=(), changed=changed, planned=False, cpu_s=time.thread_time() - began,
                          behind=_behind(), events=events)
    with transaction.atomic():
        if fence is not None:
            fence()
        observed = refresh_observations(now)  # the plan reads the figures it folds in
        planned = _plan_and_apply(now, actions, touched, setbacks, notes)
        rolled = roll(touched, notes)  # rollouts of changed artifacts, a replica at a time (after the plan's moves)
        replanned = lifecycle | observed | planned.changed | rolled
        changed = replanned | refresh_deployment_states()
        # The pass's events before the host rows below, which intake's acks and leases wait for until this
        # commits. (No lock order can cross there: the event rows a pass folds into are its own, since a fold
        # matches the actor, and intake's are the agents'.)
        record(notes, now)
        events += len(notes)
        # Desired states are rebuilt for the hosts this pass changed (and those marked stale); every host's
        # now and then, so that nothing depends on this bookkeeping being perfect.
        sweep = time.monotonic() - _last_sweep >= DESIRED_SWEEP_SECONDS
        states = bump_generations(None if sweep else touched)
        hosts = tuple(states)
    if sweep:
        _last_sweep = time.monotonic()
    _log_actions(notes)  # after the pass's transaction: what it did, not what it tried
    return PassResult(changed_hosts=hosts, changed=changed or bool(hosts), replanned=replanned or bool(hosts),
                      actions=tuple(actions), cpu_s=time.thread_time() - began, behind=_behind(), events=events,
                      states=states,
                      refused=tuple(t for a, t in setbacks if a == "refuse"),
                      preempted=tuple(t for a, t in setbacks if a == "preempt"),
                      recheck_at=planned.recheck_at, busy=planned.busy)


def _log_actions(notes: list[Note]) -> None:
    """The pass's actions in the log: a line each for the first LOGGED_ACTIONS, then one line counting the rest.
    A rollout's pass places a thousand replicas, and a line each cost the pass's thread 0.7 s in 25 s of a
    1,000-host wave (py-spy), in a process whose agent links wait for the interpreter lock; the events keep every
    one."""
    for note in notes[:LOGGED_ACTIONS]:
        log.info("%s %s: %s", note.reason.lower(), note.object, note.message)
    rest = Counter(note.reason.lower() for note in notes[LOGGED_ACTIONS:])
    if rest:
        log.info("and %d more actions this pass (%s): the events list each", rest.total(),
                 ", ".join(f"{n} {reason}" for reason, n in rest.most_common()))


def _behind() -> tuple[int, ...]:
    """Connected hosts that have not acknowledged their current generation."""
    return tuple(Host.objects.filter(connected=True, generation__gt=F("acked_generation")).values_list("pk", flat=True))
