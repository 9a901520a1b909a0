"""A deployment's state and the reason shown with it, derived from its replicas' rows and the scheduler's answer
to requests for it (console/deployments/serving.py's REFUSED), once per pass."""

from __future__ import annotations

from typing import NamedTuple

from console.bulk import update_values
from console.carried import CarriedRows
from console.deployments.models import Deployment, DeploymentState, Replica
from console.deployments.serving import REFUSED, start_estimate


def derive_state(replicas: list[Replica], blocked: str = "") -> tuple[str, str]:
    """A deployment's state and reason, from its replicas; `blocked`: why a request to it would be refused now
    (the scheduler's answer), so that its reason does not promise one is brought back. Where a request must start a
    replica, the reason says how long one took to start last (its start_seconds, measured).

    A replica asked to sleep that its agent stopped instead (vLLM cannot sleep on CPU; a host's sleep budget) is
    stopped, not asleep: a request starts it from disk."""
    comes_back = f"requests get 503 now: {blocked}" if blocked else ""
    if not replicas:
        return DeploymentState.PENDING, "waiting for the scheduler"
    serving = [r for r in replicas if r.desired_state in ("ready", "preloaded")]
    unplaced = [r for r in serving if r.host_id is None]
    stopped = [r for r in replicas if r.desired_state == "sleeping" and r.observed_state == "stopped"]
    asleep = len(replicas) - len(serving) - len(stopped)
    if unplaced and all("scaled to zero" in r.reason for r in unplaced) and len(unplaced) == len(serving):
        where = f"{asleep} asleep in host memory, " if asleep else ""
        state = DeploymentState.ASLEEP if asleep else DeploymentState.IDLE
        return state, (f"scaled to zero ({where}{len(unplaced) + len(stopped)} stopped); "
                       f"{comes_back or 'a request brings one back'}")
    if unplaced and unplaced[0].reason:
        if len(unplaced) == len(replicas):
            return DeploymentState.UNSCHEDULABLE, unplaced[0].reason
        return DeploymentState.DEGRADED, f"{len(unplaced)} of {len(replicas)} replicas unplaced: {unplaced[0].reason}"
    failed = [r for r in replicas if r.observed_state == "failed"]
    if failed:
        why = failed[0].observed_reason or "its agent gave no reason"
        return DeploymentState.FAILED, f"replica {failed[0].index} failed: {why}"
    states = [r.observed_state for r in serving]
    if states and all(s == r.desired_state for s, r in zip(states, serving, strict=True)) \
            and any(r.desired_state == "preloaded" for r in serving):
        return DeploymentState.READY, "standing by: loaded on its GPUs, taking no requests until standby is off"
    if states and all(s == "ready" for s in states):
        return DeploymentState.READY, _off_gpu(asleep, len(stopped))
    if not serving and not asleep:
        start_s = start_estimate(stopped)
        return DeploymentState.IDLE, f"{_stopped_words(stopped)}; {comes_back or 'a request starts one'}" + (
            f" (its last start took {start_s:.0f} s)" if start_s and not comes_back else "")
    if not serving:
        more = f", {len(stopped)} stopped" if stopped else ""
        return DeploymentState.ASLEEP, (f"all {asleep} replica(s) asleep in host memory{more}; "
                                        f"{comes_back or 'a request wakes one'}")
    if "loading" in states or "starting" in states:
        return DeploymentState.LOADING, "loading weights"
    return DeploymentState.PENDING, "waiting for an agent to start the replica"


def _off_gpu(asleep: int, stopped: int) -> str:
    """Beside a ready replica: those asleep in host memory and those stopped."""
    said = [f"{n} replica(s) {what}" for n, what in ((asleep, "asleep in host memory"), (stopped, "stopped")) if n]
    return ", ".join(said)


def _stopped_words(stopped: list) -> str:
    """"all 2 replica(s) stopped instead of sleeping: why" (the agent's word on the first)."""
    why = stopped[0].observed_reason or ""
    lead = "stopped instead of sleeping: "
    if why.startswith(lead):
        return f"all {len(stopped)} replica(s) {lead}{why[len(lead):]}"
    return f"all {len(stopped)} replica(s) stopped" + (f": {why}" if why else "")


class StateRow(NamedTuple):
    """What derive_state reads of a replica row."""

    index: int
    host_id: int | None
    desired_state: str
    observed_state: str
    reason: str
    observed_reason: str
    start_seconds: float | None = None


_REPLICA_STATES = CarriedRows(Replica, ("deployment_id", *StateRow._fields), ("deployment_id", "index"))
_DEPLOYMENT_STATES = CarriedRows(Deployment, ("pk", "state", "reason", "demand_status", "demand_reason"), ("pk",))


def refresh_deployment_states() -> bool:
    """Each deployment's state and reason, from its replicas and the scheduler's answer to its requests; whether
    any changed."""
    replicas: dict[int, list[StateRow]] = {}
    for dep_id, *fields in _REPLICA_STATES.read():
        replicas.setdefault(dep_id, []).append(StateRow(*fields))
    moved = []
    for pk, state_was, reason_was, demand_status, demand_reason in _DEPLOYMENT_STATES.read():
        state, reason = derive_state(replicas.get(pk, []), demand_reason if demand_status in REFUSED else "")
        if (state_was, reason_was) != (state, reason):
            moved.append((pk, state, reason))
    # Updates, not saves: a deployment deleted since it was read is no error. One statement per row, pipelined.
    update_values(Deployment, ("state", "reason"), moved)
    return bool(moved)
