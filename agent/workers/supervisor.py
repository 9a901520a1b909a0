"""Daemon-side supervision of worker processes: the replicas' workers by id, and the warm spares (no torch).

A worker's own state, commands and heartbeat are in agent.workers.handle; what its commands fail
with is in agent.workers.errors (both re-exported here).
"""

from __future__ import annotations

import asyncio

from agent.workers.errors import (
    InferenceError,
    InferenceInputError,
    InferenceOutOfMemory,
    InferenceTimeout,
    WorkerUnavailable,
)
from agent.workers.handle import DEFAULT_STOP_TIMEOUT, StatusCallback, WorkerHandle, WorkerState
from agent.workers.heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from agent.workers.spares import SparePool
from agent.workers.spec import WorkerSpec

DEFAULT_WARM_SPARES = 1

__all__ = [
    "DEFAULT_WARM_SPARES",
    "InferenceError",
    "InferenceInputError",
    "InferenceOutOfMemory",
    "InferenceTimeout",
    "Supervisor",
    "WorkerHandle",
    "WorkerState",
    "WorkerUnavailable",
]


class Supervisor:
    """The agent's workers by replica id, and the warm spares that new replicas adopt."""

    def __init__(
        self,
        on_change: StatusCallback | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        warm_spares: int = 0,
        on_progress: StatusCallback | None = None,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    ) -> None:
        self._on_change = on_change
        self._on_progress = on_progress
        self._heartbeat = (heartbeat_interval, heartbeat_timeout)
        self._stop_timeout = stop_timeout
        self._handles: dict[int, WorkerHandle] = {}
        self.spares = SparePool(warm_spares, stop_timeout)

    def start_spares(self) -> None:
        """Spawn the warm spares; call from the running event loop (spares need it to be watched)."""
        self.spares.fill()

    def start(self, spec: WorkerSpec, after_load: str = "ready") -> WorkerHandle:
        """Start a worker for a replica that has none: a warm spare when one waits, else a cold spawn.

        `after_load` is where it lands once loaded: "ready" (serving) or "preloaded" (on the device, idle).
        """
        if spec.replica_id in self._handles:
            raise ValueError(f"replica {spec.replica_id} already has a worker")
        handle = self._new(spec)
        handle.after_load = "preloaded" if after_load == "preloaded" else "ready"
        self._handles[spec.replica_id] = handle
        try:
            handle.start(self.spares.take())
        except OSError as e:  # no process could be made (fd or process limits): report it as the reason
            handle.fail_without_start(f"cannot start a worker process: {e}")
        return handle

    def add_failed(self, spec: WorkerSpec, reason: str) -> WorkerHandle:
        """Track a replica that failed before any process started, so it is reported and served as failed."""
        handle = self._new(spec)
        self._handles[spec.replica_id] = handle
        handle.fail_without_start(reason)
        return handle

    def _new(self, spec: WorkerSpec) -> WorkerHandle:
        interval, timeout = self._heartbeat
        return WorkerHandle(spec, self._on_change, self._on_progress, interval, timeout)

    def get(self, replica_id: int) -> WorkerHandle | None:
        return self._handles.get(replica_id)

    def handles(self) -> list[WorkerHandle]:
        """Every tracked replica, in replica id order."""
        return [self._handles[k] for k in sorted(self._handles)]

    async def stop(self, replica_id: int) -> None:
        """Stop a replica's worker and forget it."""
        handle = self._handles.get(replica_id)
        if handle is not None:
            await handle.stop(self._stop_timeout)
            # Forgotten only once stopped: if this is cancelled half-way, stop_all() still sees it.
            if self._handles.get(replica_id) is handle:
                del self._handles[replica_id]

    async def evict(self, replica_id: int, reason: str) -> None:
        """Stop a replica's worker but keep it, reported `stopped` with `reason`, until it is stopped or started."""
        handle = self._handles.get(replica_id)
        if handle is not None:
            await handle.stop(self._stop_timeout, reason)

    async def stop_all(self) -> None:
        """Stop every worker and every spare, in parallel; no process is left behind and no spare is
        started again (this is the agent's shutdown)."""
        await asyncio.gather(self.spares.close(), *(self.stop(replica_id) for replica_id in list(self._handles)))
