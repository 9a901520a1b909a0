"""Daemon-side supervision of worker processes: the replicas by id, their one event queue, the warm spares, and
the workers a previous agent left running (no torch).

Every worker's link (agent.workers.link) puts what it hears (loading, progress, ready, failed, exit) on one
queue, and each replica record (agent.workers.handle) announces the changes its own calls made there too.
The supervisor's consumer applies the link events to the records and tells its one listener (the agent's
replicas) of every change, in order; `settle()` does the same at once for callers that must have been
heard before they go on. A replica's commands are in agent.workers.handle; what they fail with
is in agent.workers.errors (both re-exported here).

With a state directory (agent.workers.rendezvous), replica workers outlive the agent: `detach_all()` leaves them
running, and the next agent's `adopt_all()` finds them by their sockets and takes them over as they are. Each
replica's workers write their output to its log (agent.workers.logs: in the state directory, else a temporary
one), which the supervisor keeps rotated and pruned while it has replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from multiprocessing import AuthenticationError
from typing import Any

from agent import engines
from agent.workers.errors import (
    InferenceError,
    InferenceInputError,
    InferenceOutOfMemory,
    InferenceTimeout,
    WorkerUnavailable,
)
from agent.workers.handle import DEFAULT_STOP_TIMEOUT, Changed, WorkerHandle, WorkerState
from agent.workers.heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from agent.workers.link import LinkEvent
from agent.workers.logs import CHECK_INTERVAL, ReplicaLogs
from agent.workers.messages import WORKER_PROTOCOL, Describe, Description, Progress, Stop
from agent.workers.processes import AdoptedProcess
from agent.workers.rendezvous import HANDSHAKE_TIMEOUT, WorkerDirectory, WorkerSocket, connect
from agent.workers.spares import SparePool
from agent.workers.spec import WorkerSpec

log = logging.getLogger(__name__)

DEFAULT_WARM_SPARES = 1

Listener = Callable[[WorkerHandle, bool], None]  # (the replica that changed, whether only its loading progress)

__all__ = [
    "DEFAULT_WARM_SPARES",
    "InferenceError",
    "InferenceInputError",
    "InferenceOutOfMemory",
    "InferenceTimeout",
    "Listener",
    "Supervisor",
    "WorkerHandle",
    "WorkerState",
    "WorkerUnavailable",
]


class Supervisor:
    """The agent's workers by replica id, and the warm spares that new replicas adopt."""

    def __init__(
        self,
        listener: Listener | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        warm_spares: int = 0,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        directory: WorkerDirectory | None = None,
    ) -> None:
        self._listener = listener
        self.directory = directory  # opened: replica workers outlive the agent there; None: they die with it
        self._heartbeat = (heartbeat_interval, heartbeat_timeout)
        self._stop_timeout = stop_timeout
        self._handles: dict[int, WorkerHandle] = {}
        self.events: asyncio.Queue[LinkEvent | Changed] = asyncio.Queue()
        self._consumer: asyncio.Task | None = None
        self._log_keeper: asyncio.Task | None = None
        self.spares = SparePool(warm_spares, stop_timeout)
        self.logs = ReplicaLogs(directory.root / "logs" if directory is not None else None)

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
            attach = self.directory.attach_for(spec.replica_id) if self.directory is not None else None
            # Spares hold the built-in engine's imports; an engine in processes of its own imports its own.
            spare = self.spares.take() if engines.get(spec.engine).in_worker else None
            handle.start(spare, attach, self.logs.for_worker(spec.replica_id))
        except OSError as e:  # no process could be made (fd or process limits): report it as the reason
            handle.fail_without_start(f"cannot start a worker process: {e}")
        self.settle()
        return handle

    def add_failed(self, spec: WorkerSpec, reason: str) -> WorkerHandle:
        """Track a replica that failed before any process started, so it is reported and served as failed."""
        handle = self._new(spec)
        self._handles[spec.replica_id] = handle
        handle.fail_without_start(reason)
        self.settle()
        return handle

    def _new(self, spec: WorkerSpec) -> WorkerHandle:
        if self._consumer is None:
            self._consumer = asyncio.get_running_loop().create_task(self._consume(), name="modelgrid-replica-events")
            self._log_keeper = asyncio.get_running_loop().create_task(self._keep_logs(), name="modelgrid-worker-logs")
        interval, timeout = self._heartbeat
        return WorkerHandle(spec, self.events, interval, timeout)

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
            self.settle()  # heard while still tracked: the report sent with it lists the replica stopped
            # Forgotten only once stopped: if this is cancelled half-way, stop_all() still sees it.
            if self._handles.get(replica_id) is handle:
                del self._handles[replica_id]

    async def evict(self, replica_id: int, reason: str) -> None:
        """Stop a replica's worker but keep it, reported `stopped` with `reason`, until it is stopped or started."""
        handle = self._handles.get(replica_id)
        if handle is not None:
            await handle.stop(self._stop_timeout, reason)
            self.settle()

    async def stop_all(self) -> None:
        """Stop every worker and every spare, in parallel; no process is left behind and no spare is
        started again (this is the agent's shutdown)."""
        await asyncio.gather(self.spares.close(), *(self.stop(replica_id) for replica_id in list(self._handles)))
        self.settle()
        await self._stop_consumer()
        self.logs.close()  # a temporary directory's logs go with the workers that wrote them

    async def _stop_consumer(self) -> None:
        tasks, self._consumer, self._log_keeper = (self._consumer, self._log_keeper), None, None
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _keep_logs(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                await asyncio.to_thread(self.logs.upkeep, set(self._handles))
            except OSError as e:  # a full or read-only disk: the workers' own writes fail quietly too
                log.warning("cannot rotate or prune the worker logs: %s", e)

    async def detach_all(self) -> None:
        """Stop the spares but leave every replica worker running with its model, for the next agent to adopt
        (this is the agent's shutdown when its workers outlive it). Nothing is reported: they did not stop."""
        handles, self._handles = list(self._handles.values()), {}
        await asyncio.gather(self.spares.close(), *(h.detach() for h in handles))
        await self._stop_consumer()

    # --- adopting what a previous agent left --------------------------------------------------

    async def adopt_all(self) -> list[WorkerHandle]:
        """Take over every live worker in the state directory, as it is (ready, sleeping, or still loading), and
        remove the sockets of workers that are gone. Call before any replica is started."""
        if self.directory is None:
            return []
        sockets = self.directory.sockets()
        found = await asyncio.gather(*(asyncio.to_thread(self._describe, s) for s in sockets))
        adopted = []
        for sock, result in zip(sockets, found, strict=True):
            if result is None:
                continue
            process, conn, description = result
            if description.spec.replica_id != sock.replica_id or sock.replica_id in self._handles:
                log.warning("worker pid %d on %s runs replica %d: left alone", description.pid, sock.path,
                            description.spec.replica_id)
                conn.close()
                process.close()
                continue
            handle = self._new(description.spec)
            self._handles[sock.replica_id] = handle
            handle.adopt(process, conn, description, str(sock.path))
            adopted.append(handle)
        self.settle()
        return adopted

    def _describe(self, sock: WorkerSocket) -> tuple[AdoptedProcess, Any, Description] | None:
        """Connect to one worker socket and ask what it runs (in a thread: it blocks). None when there is no live
        worker of ours there; a stale socket is removed."""
        try:
            conn = connect(sock.path, self.directory.authkey)
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("removing %s: its worker is gone", sock.path)
            with contextlib.suppress(OSError):
                os.unlink(sock.path)
            return None
        except AuthenticationError:
            log.warning("the worker on %s does not hold this agent's key: left alone (it exits after its orphan "
                        "timeout)", sock.path)
            return None
        except OSError as e:  # TimeoutError included: it is busy with another connection
            log.warning("cannot reach the worker on %s: %s", sock.path, e or type(e).__name__)
            return None
        try:
            conn.send(Describe())
            if not conn.poll(HANDSHAKE_TIMEOUT):
                raise TimeoutError(f"no description within {HANDSHAKE_TIMEOUT:g} s")
            description = conn.recv()
            if not isinstance(description, Description):
                raise ValueError(f"it answered {type(description).__name__} instead of a description")
            if description.protocol != WORKER_PROTOCOL:
                raise ValueError(f"it speaks worker protocol {description.protocol}, this agent {WORKER_PROTOCOL}")
            process = AdoptedProcess(description.pid)
        except Exception as e:  # an older worker's answer may not even unpickle here
            log.warning("cannot adopt the worker on %s: %s; stopping it (its replica loads afresh if still wanted)",
                        sock.path, e or type(e).__name__)
            with contextlib.suppress(OSError):
                conn.send(Stop())  # the one message every version of the worker takes
            conn.close()
            return None
        return process, conn, description

    # --- the event queue ------------------------------------------------------------------------

    def settle(self) -> None:
        """Apply every event waiting now, so that a change the caller just made is heard before it goes on
        (the console hears a replica is starting before the acknowledgement of the state that started it)."""
        while True:
            try:
                event = self.events.get_nowait()
            except asyncio.QueueEmpty:
                return
            self._take(event)

    async def _consume(self) -> None:
        # Applying an event never waits, so this task is always back at get() when the next one comes: a link
        # event is applied before the callers its link woke (a request the exit failed) run.
        while True:
            self._take(await self.events.get())

    def _take(self, event: LinkEvent | Changed) -> None:
        try:
            if isinstance(event, Changed):
                self._tell(event.handle, False)
                return
            handle = self._handles.get(event.link.replica_id)
            if handle is None or handle.link is not event.link:
                return  # a worker this replica no longer has (stopped, or replaced by a restart)
            if handle.apply(event.what):
                self._tell(handle, False)
            elif isinstance(event.what, Progress):
                self._tell(handle, True)
        except Exception:  # a bug in one listener must not stop every replica's events
            log.exception("replica event %r failed", event)

    def _tell(self, handle: WorkerHandle, progress: bool) -> None:
        if self._listener is not None:
            self._listener(handle, progress)
