"""Diff desired replicas against running workers: what to start, stop, sleep, wake, promote (pure, no I/O).

Target states: `ready` (serving), `preloaded` (weights on the device, warmed up, not serving: the next
model staged while the current one serves), `sleeping` (weights in host memory, device freed),
`stopped` (no worker). A worker is moved between ready, preloaded and sleeping in place (no restart);
it is restarted only when what it runs changed. Actions come out in the order that keeps a switch
gapless: promotions first, then what frees device memory (stops, sleeps), then wakes and starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agent import engines
from agent.artifacts import capability
from agent.protocol import ENDED, LOADING, ON_DEVICE, DesiredReplica, DesiredState
from agent.sleep_budget import Sleeper, fit
from agent.workers.spec import WorkerSpec

Verb = Literal["promote", "stop", "evict", "demote", "sleep", "wake", "start", "retarget"]
PHASES: tuple[Verb, ...] = ("promote", "stop", "evict", "demote", "sleep", "wake", "start", "retarget")


@dataclass(frozen=True)
class Running:
    """A tracked worker as the diff sees it."""

    spec: WorkerSpec
    state: str
    generation: int  # the desired-state generation it was started (or last stopped or failed) under
    target: str = "ready"  # where it is heading: ready, preloaded or sleeping
    weights_bytes: int = 0  # host bytes it holds asleep, or would hold (0: not known yet)
    last_used: float = 0.0


@dataclass(frozen=True)
class Action:
    verb: Verb
    replica_id: int
    target: str  # the state it heads for
    reason: str  # one line for the log
    replica: DesiredReplica | None = None  # what to start
    detail: str = ""  # evict: the reason the stopped replica reports


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = field(default_factory=tuple)

    def ids(self, verb: Verb) -> tuple[int, ...]:
        return tuple(a.replica_id for a in self.actions if a.verb == verb)

    @property
    def stop(self) -> tuple[int, ...]:
        """Every worker that ends: stopped, evicted, or restarted."""
        return tuple(a.replica_id for a in self.actions if a.verb in ("stop", "evict"))

    @property
    def start(self) -> tuple[DesiredReplica, ...]:
        return tuple(a.replica for a in self.actions if a.verb == "start" and a.replica is not None)

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(a.reason for a in self.actions)


def device_for(replica: DesiredReplica, device_kind: str) -> str:
    """Where a replica's worker loads its model: its first GPU on CUDA hosts, else the CPU."""
    if device_kind == "cuda":
        return f"cuda:{replica.gpus[0] if replica.gpus else 0}"
    return "cpu"


def plan_convergence(
    desired: DesiredState,
    running: dict[int, Running],
    device_kind: str,
    free_bytes: dict[int, int] | None = None,
    sleep_budget: int | None = None,
) -> Plan:
    """The actions that take `running` to `desired`.

    free_bytes: device memory free per GPU index, for staging a sleeping replica on its device when
    it is asked to be `preloaded` (without room it stays asleep, its host copy ready).
    sleep_budget: host bytes sleeping replicas may hold together; the least recently used beyond it
    are stopped. A failed worker, or one stopped to keep the budget, is left alone until the console
    sends a different generation.
    """
    wanted = {r.id: r for r in desired.replicas}
    free = dict(free_bytes or {})
    actions: list[Action] = []
    for replica_id in running:
        replica = wanted.get(replica_id)
        if replica is None or replica.state == "stopped":
            target = replica.state if replica else "absent"
            why = f"replica {replica_id}: stop (desired state is {target})"
            actions.append(Action("stop", replica_id, "stopped", why))
    for replica_id, replica in wanted.items():
        if replica.state == "stopped":
            continue
        actions.extend(_converge_one(replica, running.get(replica_id), desired.generation, device_kind, free))
    if sleep_budget is not None:
        actions = _keep_budget(actions, running, sleep_budget)
    order = {verb: i for i, verb in enumerate(PHASES)}
    return Plan(tuple(sorted(actions, key=lambda a: order[a.verb])))  # stable: same-phase order kept


def _converge_one(
    replica: DesiredReplica, current: Running | None, generation: int, device_kind: str, free: dict[int, int]
) -> list[Action]:
    rid, target = replica.id, replica.state
    # An engine that cannot sleep here (vLLM on CPU) would load only to be stopped again: it is left stopped until
    # it is wanted ready (a new agent, or a new generation, started it again with no request waiting).
    device = capability.device_kind(device_for(replica, device_kind))
    never_sleeps = target == "sleeping" and not engines.sleeps_on(replica.engine, device)
    if current is None:
        if never_sleeps:
            return []
        return [Action("start", rid, target, f"replica {rid}: start {replica.deployment} from {replica.model_path}"
                       + ("" if target == "ready" else f" (then {target})"), replica)]
    changed = _changes(current.spec, replica, device_kind)
    if changed:
        return _restart(replica, f"{changed} changed")
    if current.state in ENDED:
        if current.generation == generation or never_sleeps:
            return []
        return _restart(replica, f"it {current.state} and generation {generation} asks for it again")
    if current.state in LOADING:
        if current.target != target:
            return [Action("retarget", rid, target, f"replica {rid}: once loaded, {target}")]
        return []
    if target == "ready":
        if current.state == "preloaded":
            return [Action("promote", rid, "ready", f"replica {rid}: preloaded -> ready (no copy needed)")]
        if current.state == "sleeping":
            return [Action("wake", rid, "ready", f"replica {rid}: wake")]
        return []
    if target == "sleeping":
        if current.state in ON_DEVICE:
            return [Action("sleep", rid, "sleeping", f"replica {rid}: sleep ({current.state} -> sleeping)")]
        return []
    # target == "preloaded"
    if current.state == "ready":
        return [Action("demote", rid, "preloaded", f"replica {rid}: ready -> preloaded (stays on its device)")]
    if current.state == "sleeping":
        gpu = replica.gpus[0] if replica.gpus else 0
        room = free.get(gpu, 0)
        if current.weights_bytes and room >= current.weights_bytes:
            free[gpu] = room - current.weights_bytes
            return [Action("wake", rid, "preloaded", f"replica {rid}: wake onto GPU {gpu} as preloaded")]
        return []  # no room on its device: its host copy is ready, one wake away
    return []


def _restart(replica: DesiredReplica, why: str) -> list[Action]:
    text = f"replica {replica.id}: restart ({why})"
    return [Action("stop", replica.id, "stopped", text), Action("start", replica.id, replica.state, text, replica)]


def _keep_budget(actions: list[Action], running: dict[int, Running], budget: int) -> list[Action]:
    leaving = {a.replica_id for a in actions if a.verb in ("stop", "wake")}
    sleeping = [
        Sleeper(rid, r.weights_bytes, r.last_used)
        for rid, r in running.items()
        if r.state == "sleeping" and rid not in leaving
    ]
    incoming = [a for a in actions if a.verb == "sleep"]
    newcomers = [Sleeper(a.replica_id, running[a.replica_id].weights_bytes, running[a.replica_id].last_used)
                 for a in incoming]
    dropped = fit(sleeping + newcomers, budget)
    if not dropped:
        return actions
    kept = [a for a in actions if not (a.verb == "sleep" and a.replica_id in dropped)]
    kept.extend(Action("evict", rid, "stopped", f"replica {rid}: {why}", detail=why) for rid, why in dropped.items())
    return kept


def _changes(spec: WorkerSpec, replica: DesiredReplica, device_kind: str) -> str:
    fields = {
        "model_path": (spec.model_path, replica.model_path),
        "dtype": (spec.dtype, replica.dtype),
        "deployment": (spec.deployment, replica.deployment),
        "engine": (spec.engine, replica.engine),
        "artifact revision": (spec.revision, replica.revision),
    }
    engine = engines.ENGINES.get(replica.engine)
    if engine is not None:
        fields |= engine.start_fields(spec, replica)
    # A sleeping replica holds no GPU (the console lists none for it): where it wakes is decided when it
    # is woken, so that is no change that would restart it. Nor is a new MPS share: CUDA reads it once,
    # when the worker's context is made, and a neighbour arriving or leaving must not cost this replica a
    # reload; the new share applies from its next start (its status reports the share it runs with).
    if replica.state != "sleeping":
        fields["device"] = (spec.device, device_for(replica, device_kind))
    return ", ".join(name for name, (old, new) in fields.items() if old != new)
