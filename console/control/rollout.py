"""Rolling a deployment's replicas onto new artifacts (its model's files, its adapters') one at a time, drained.

A PATCH that changes an artifact (console/catalog) calls `begin_rollout`: each replica that runs somewhere is held
at what it runs (`Replica.held`: the revision, the model path, the adapters' paths), and the deployment's revision
is bumped. A held replica's desired state names what it holds (console/control/desired.py), so nothing restarts
yet. Each scheduler pass then calls `roll`, which per deployment:

1. sees the replica it released last through: back and ready under a new worker (another pid), or gone from its
   host; one that failed to start from the new revision halts the rollout (`restarting_pid` 0) and says so, while
   the rest keep serving the old one; a later PATCH starts over;
2. releases at once the held replicas that serve nothing (loading, failed, not started): they start anew anyway;
3. releases one serving replica, the lowest index first, once another serves (or none is on its way): its agent
   sees the new revision, drains it (it finishes its requests, taking no new ones) and restarts it.

Asleep replicas stay held until they are woken (a restart would load them onto a GPU only to put them to sleep),
then roll like the others. The agent restarts a worker whose revision changed (agent/converge.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q

from console.bulk import update_fields_by_pk
from console.catalog.models import Adapter
from console.control.desired import mark_stale
from console.deployments.models import Deployment, Replica
from console.events.record import Note, deployment_object, replica_object

SERVING = ("ready", "preloaded")
ON_ITS_WAY = ("pending", "starting", "loading")
HALTED = 0  # restarting_pid of a replica that failed to start from the new revision: the rollout waits on it


def begin_rollout(deployments: Iterable[Deployment]) -> list[str]:
    """Hold each placed replica of these deployments (locked by the caller, before their artifacts' rows change) at
    what it runs, and bump their revisions; returns the deployments' names. The scheduler's passes release the
    replicas one at a time (roll)."""
    deployments = list(deployments)
    pks = [d.pk for d in deployments]
    paths = dict(Deployment.objects.filter(pk__in=pks).values_list("pk", "model__path"))
    adapters: dict[int, dict[str, str]] = {pk: {} for pk in pks}
    for dep_id, name, path in Adapter.objects.filter(deployment_id__in=pks).values_list("deployment_id", "name",
                                                                                         "path"):
        adapters[dep_id][name] = path
    revisions = {d.pk: d.revision for d in deployments}
    holds = []
    for row in Replica.objects.filter(deployment_id__in=pks, host__isnull=False).only("pk", "deployment_id", "held",
                                                                                      "restarting_pid"):
        if not row.held:  # one held already keeps what it runs: the rollout before this one had not reached it
            row.held = {"revision": revisions[row.deployment_id], "model_path": paths[row.deployment_id],
                        "adapters": adapters[row.deployment_id]}
        row.restarting_pid = None
        holds.append((row, ["held", "restarting_pid"]))
    update_fields_by_pk(Replica, holds)
    for dep in deployments:
        dep.revision += 1
        dep.save(update_fields=["revision"])
    mark_stale(deployments)
    return [d.name for d in deployments]


@dataclass
class _Row:
    pk: int
    deployment_id: int
    index: int
    host_id: int | None
    desired_state: str
    observed_state: str
    observed_reason: str
    pid: int | None
    held: dict
    restarting_pid: int | None

    @property
    def serving(self) -> bool:
        return self.host_id is not None and self.observed_state in SERVING


_FIELDS = tuple(_Row.__dataclass_fields__)


def roll(touched: set[int], notes: list[Note]) -> bool:
    """One step of every rollout under way (see the module's docstring); `touched` collects the hosts whose desired
    state changes, `notes` what the timeline is told. True if any replica row changed."""
    rolling = set(Replica.objects.filter(Q(held__has_key="revision") | Q(restarting_pid__isnull=False))
                  .values_list("deployment_id", flat=True))
    if not rolling:
        return False
    by_deployment: dict[int, list[_Row]] = {}
    for values in Replica.objects.filter(deployment_id__in=rolling).order_by("deployment_id", "index").values_list(
            *_FIELDS):
        row = _Row(*values)
        by_deployment.setdefault(row.deployment_id, []).append(row)
    deployments = dict(Deployment.objects.filter(pk__in=rolling).values_list("pk", "name"))
    revisions = dict(Deployment.objects.filter(pk__in=rolling).values_list("pk", "revision"))
    writes: list[tuple[_Row, list[str]]] = []
    for dep_id, rows in sorted(by_deployment.items()):
        if dep_id in deployments:  # else deleted since it was read
            _step(deployments[dep_id], revisions[dep_id], rows, writes, touched, notes)
    update_fields_by_pk(Replica, writes)
    return bool(writes)


def _step(name: str, revision: int, rows: list[_Row], writes: list, touched: set[int], notes: list[Note]) -> None:
    changed = False
    for row in rows:
        if row.restarting_pid is None:
            continue
        if row.host_id is None or (row.observed_state in SERVING and row.pid != row.restarting_pid):
            row.restarting_pid = None  # back under a new worker, or moved off its host (it starts anew elsewhere)
            writes.append((row, ["restarting_pid"]))
            changed = True
        elif row.observed_state == "failed" and row.restarting_pid != HALTED:
            row.restarting_pid = HALTED
            writes.append((row, ["restarting_pid"]))
            held = sum(1 for r in rows if r.held)
            notes.append(Note(deployment_object(name), "RolloutHalted", f"replica {name}#{row.index} failed to start "
                              f"from revision {revision}: {row.observed_reason or 'its agent gave no reason'}; "
                              f"{held} replica(s) keep running the revision before it: fix the artifact and PATCH it "
                              "again", warning=True, actor="scheduler", deployment=name))
    if any(r.restarting_pid is not None for r in rows):
        return  # one at a time: the replica released last is not back yet (or the rollout halted on it)
    held = [r for r in rows if r.held]
    for row in held:
        if not row.serving and not (row.host_id is not None and row.observed_state == "sleeping"):
            _release(row, None, writes, touched)  # it serves nothing: it starts from the new revision anyway
            changed = True
    waiting = [r for r in held if r.serving]
    if waiting:
        row = waiting[0]
        others = [r for r in rows if r is not row]
        if any(r.serving for r in others) or not any(r.host_id is not None and r.observed_state in ON_ITS_WAY
                                                      for r in others):
            _release(row, row.pid, writes, touched)
            changed = True
            more = len(waiting) - 1
            notes.append(Note(replica_object(name, row.index), "Restarting", f"restarting onto revision {revision} "
                              "of its artifacts (its model or adapters changed): it finishes its requests first"
                              + (f"; {more} more after it, one at a time" if more else ""), actor="scheduler",
                              deployment=name))
    if changed and not any(r.held or r.restarting_pid is not None for r in rows):
        notes.append(Note(deployment_object(name), "RolledOut", f"all {len(rows)} replica(s) run revision {revision} "
                          "of its artifacts", actor="scheduler", deployment=name))


def _release(row: _Row, pid: int | None, writes: list, touched: set[int]) -> None:
    row.held, row.restarting_pid = {}, pid
    writes.append((row, ["held", "restarting_pid"]))
    if row.host_id is not None:
        touched.add(row.host_id)
