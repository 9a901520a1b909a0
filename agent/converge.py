"""Diff desired replicas against running workers: which to stop and which to start (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol import DesiredReplica, DesiredState
from agent.workers.spec import WorkerSpec


@dataclass(frozen=True)
class Running:
    """A tracked worker as the diff sees it."""

    spec: WorkerSpec
    state: str
    generation: int  # the desired-state generation it was started under


@dataclass(frozen=True)
class Plan:
    stop: tuple[int, ...]
    start: tuple[DesiredReplica, ...]
    reasons: tuple[str, ...]  # one line per action, for the log


def device_for(replica: DesiredReplica, device_kind: str) -> str:
    """Where a replica's worker loads its model: its first GPU on CUDA hosts, else the CPU."""
    if device_kind == "cuda":
        return f"cuda:{replica.gpus[0] if replica.gpus else 0}"
    return "cpu"


def plan_convergence(desired: DesiredState, running: dict[int, Running], device_kind: str) -> Plan:
    """Stop what is not wanted (or changed), start what is wanted and missing.

    A failed worker is left failed (no restart loop) until its replica changes or the console sends
    a different generation; then it is started again.
    """
    wanted = {r.id: r for r in desired.replicas if r.state == "ready"}
    stop: list[int] = []
    start: list[DesiredReplica] = []
    reasons: list[str] = []
    for replica_id in running:
        if replica_id not in wanted:
            # `sleeping` is not implemented yet: such a replica is stopped, which frees its memory too.
            target = next((r.state for r in desired.replicas if r.id == replica_id), "absent")
            stop.append(replica_id)
            reasons.append(f"replica {replica_id}: stop (desired state is {target})")
    for replica_id, replica in wanted.items():
        current = running.get(replica_id)
        if current is None:
            start.append(replica)
            reasons.append(f"replica {replica_id}: start {replica.deployment} from {replica.model_path}")
            continue
        changed = _changes(current.spec, replica, device_kind)
        if changed:
            why = f"{changed} changed"
        elif current.state == "failed" and current.generation != desired.generation:
            why = f"it failed and generation {desired.generation} asks for it again"
        else:
            continue
        stop.append(replica_id)
        start.append(replica)
        reasons.append(f"replica {replica_id}: restart ({why})")
    return Plan(stop=tuple(stop), start=tuple(start), reasons=tuple(reasons))


def _changes(spec: WorkerSpec, replica: DesiredReplica, device_kind: str) -> str:
    fields = {
        "model_path": (spec.model_path, replica.model_path),
        "dtype": (spec.dtype, replica.dtype),
        "deployment": (spec.deployment, replica.deployment),
        "device": (spec.device, device_for(replica, device_kind)),
    }
    return ", ".join(name for name, (old, new) in fields.items() if old != new)
