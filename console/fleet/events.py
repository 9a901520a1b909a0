"""What agents report of their replicas, told as timeline events: each change of a replica's observed state
becomes one event in words a person reads (loading, ready with its measured memory against the estimate,
failed with the worker's own error, woken, asleep, restarted)."""

from __future__ import annotations

import re

from agent.protocol import ReplicaStatus
from console.deployments.models import Replica
from console.events.record import Note, replica_object
from console.fleet.templatetags.units import gib

# A worker's error that says it ran out of device memory, or that its agent killed it for silence.
_OOM = re.compile(r"out of memory|OutOfMemory|\bOOM\b", re.IGNORECASE)
_HEARTBEAT = re.compile(r"heartbeat", re.IGNORECASE)
# How an agent words a replica it was asked to put to sleep and stopped instead (agent/replicas.py, sleep_budget.py).
STOPPED_NOT_ASLEEP = "stopped instead of sleeping"


def replica_notes(transitions: list[tuple[int, str, str, ReplicaStatus]]) -> list[Note]:
    """One event per (replica key, host name, state before, status that changed it)."""
    rows = {pk: (name, index, reservation) for pk, name, index, reservation in Replica.objects.filter(
        pk__in={t[0] for t in transitions}).values_list("pk", "deployment__name", "index", "reservation")}
    notes = []
    for pk, host, before, status in transitions:
        if pk not in rows:
            continue
        name, index, reservation = rows[pk]
        told = _told(before, status, reservation or {})
        if told is not None:
            reason, message, warning = told
            notes.append(Note(replica_object(name, index), reason, message, warning=warning, actor=f"agent {host}",
                              deployment=name, host=host))
    return notes


def _told(before: str, status: ReplicaStatus, reservation: dict) -> tuple[str, str, bool] | None:
    """(reason code, message, warning) for one state change; None for one not worth a line."""
    state, why = status.state, status.reason
    # No pids in the words: a worker restarted again and again is one line that counts, not one line a restart.
    if state == "failed":
        code = "OutOfMemory" if _OOM.search(why) else "HeartbeatTimeout" if _HEARTBEAT.search(why) else "Failed"
        return code, why or "its worker failed and its agent gave no reason", True
    if state == "starting":
        if before == "failed":
            return "Restarted", "its agent started the worker again after its failure (with backoff)", False
        if before == "stopped":
            return "Restarted", "its agent started the worker again", False
        return "Starting", "worker process started", False
    if state == "loading":
        total = f": {gib(status.total_bytes)} of weights" if status.total_bytes else ""
        return "Loading", f"loading weights{total}", False
    if state in ("ready", "preloaded"):
        if before == "sleeping":
            return "Woke", _swap("woke", status) + ("" if state == "ready" else "; standing by"), False
        return ("Ready" if state == "ready" else "Preloaded"), _loaded(status, reservation), False
    if state == "sleeping":
        return "Asleep", _swap("asleep in host memory", status), False
    if state == "stopped":
        if before == "failed":
            return None  # a failed worker's process ending: its failure was the news
        if why.startswith(STOPPED_NOT_ASLEEP):  # nothing stays in host memory: a request starts it from disk
            return "Exited", f"{why}; nothing is kept in host memory: a request starts it again from disk", False
        return "Exited", f"worker stopped{': ' + why if why else ''}", False
    return None


def _loaded(status: ReplicaStatus, reservation: dict) -> str:
    measured = status.measured_bytes
    if measured is None:
        return "loaded"
    text = f"loaded: measured {gib(measured)}"
    estimated = reservation.get("estimated_bytes")
    if estimated:
        text += f" against an estimate of {gib(estimated)} (error {100 * (estimated - measured) / measured:+.1f}%)"
    m = status.measurement
    if m is not None and m.load_seconds is not None:
        text += f" in {m.load_seconds:.2f} s"
    return text


def _swap(what: str, status: ReplicaStatus) -> str:
    sw = status.sleep_wake
    if sw is None:
        return what
    return f"{what}: {gib(sw.bytes)} in {sw.seconds:.3f} s"
