"""Daemon-side supervision of worker processes: start, watch, talk to, and stop them (no torch).

Each worker is watched through two file descriptors registered with the event loop: its pipe
(messages) and its process sentinel (exit). Nothing polls and no thread is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
from collections.abc import Callable
from typing import Any, Literal

from agent.protocol import ReplicaStatus
from agent.workers.spares import Spare, SparePool, spawn_worker
from agent.workers.spec import WorkerSpec

log = logging.getLogger(__name__)

WorkerState = Literal["pending", "loading", "ready", "failed", "stopped"]
StatusCallback = Callable[["WorkerHandle"], None]

DEFAULT_STOP_TIMEOUT = 5.0
DEFAULT_INFER_TIMEOUT = 120.0
DEFAULT_WARM_SPARES = 1


class InferenceError(RuntimeError):
    """The worker could not answer; the message says why."""


class InferenceInputError(InferenceError):
    """The worker refused the inputs (a client error, like a token id outside the vocabulary)."""


class InferenceTimeout(InferenceError):
    """The worker did not answer in time."""


class WorkerUnavailable(InferenceError):
    """The worker is not ready (still loading, failed, stopped, or it died during the request)."""


class WorkerHandle:
    """One worker process and what the agent knows about it: state, reason, measured bytes, pid."""

    def __init__(self, spec: WorkerSpec, on_change: StatusCallback | None = None) -> None:
        self.spec = spec
        self.state: WorkerState = "pending"  # until start()
        self.reason = ""
        self.measured_bytes: int | None = None
        self.info: dict[str, Any] = {}  # what the worker said about its model when ready
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.queued = 0  # requests waiting or running, for least-busy routing
        self._on_change = on_change
        self._process: Any = None
        self._conn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._idle = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._exited = asyncio.Event()
        self._stopping = False

    def start(self, spare: Spare | None = None) -> None:
        """Adopt `spare`, or spawn a worker cold; call from the event loop that will watch it."""
        self._loop = asyncio.get_running_loop()
        if spare is not None:
            try:
                spare.conn.send(("load", self.spec))
            except OSError:  # it died since the pool looked: start cold instead
                spare.conn.close()
                spare.process.join(1.0)
                spare = None
        if spare is not None:
            self._process, parent_conn = spare.process, spare.conn
        else:
            self._process, parent_conn = spawn_worker(self.spec, f"modelgrid-replica-{self.spec.replica_id}")
        self._conn = parent_conn
        self.pid = self._process.pid
        self._loop.add_reader(parent_conn.fileno(), self._on_readable)
        self._loop.add_reader(self._process.sentinel, self._on_exit)
        log.info(
            "replica %d: %s worker pid %d for %s on %s",
            self.spec.replica_id,
            "adopted warm" if spare is not None else "started",
            self.pid,
            self.spec.model_path,
            self.spec.device,
        )
        self._set("loading")

    def fail_without_start(self, reason: str) -> None:
        """Record a replica that cannot even be started (its model directory is unusable)."""
        self._exited.set()
        self._idle.set()  # a request that slips in finds the state and fails at once
        self._set("failed", reason)

    def status(self) -> ReplicaStatus:
        """This replica as the wire protocol reports it."""
        return ReplicaStatus(
            replica_id=self.spec.replica_id,
            state=self.state,
            measured_bytes=self.measured_bytes,
            reason=self.reason,
            pid=self.pid if self.state in ("loading", "ready") else None,
        )

    async def infer(self, inputs: dict[str, Any], timeout: float = DEFAULT_INFER_TIMEOUT) -> dict[str, Any]:
        """Run one request on the worker; concurrent callers queue. Raises InferenceError subclasses."""
        self.queued += 1
        try:
            async with asyncio.timeout(timeout):
                future = await self._submit(inputs)
                # Shielded: if this caller gives up, the worker still answers, and that answer is what
                # marks the worker idle again (see _submit).
                return await asyncio.shield(future)
        except TimeoutError:
            raise InferenceTimeout(f"replica {self.spec.replica_id} did not answer within {timeout:g} s") from None
        finally:
            self.queued -= 1

    async def _submit(self, inputs: dict[str, Any]) -> asyncio.Future:
        # One request inside the worker at a time. Were a second one written while the worker is
        # busy, a large request could fill the pipe while the worker blocks writing a large result
        # that we are not reading yet: a deadlock. Waiting for its answer first rules that out.
        async with self._send_lock:
            await self._idle.wait()
            if self.state != "ready":
                raise WorkerUnavailable(self._unavailable_text())
            request_id = next(self._ids)
            future = self._loop.create_future()
            self._pending[request_id] = future
            self._idle.clear()
            try:
                self._conn.send(("infer", request_id, inputs))
            except (BrokenPipeError, OSError) as e:
                self._pending.pop(request_id, None)
                self._idle.set()
                raise WorkerUnavailable(f"replica {self.spec.replica_id}: worker pipe closed ({e})") from e
            return future

    async def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """Terminate the worker (SIGTERM, then SIGKILL after `timeout`), reap it, and mark it stopped."""
        self._stopping = True
        if self._process is not None and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError, OSError):
                self._process.terminate()
            try:
                await asyncio.wait_for(self._exited.wait(), timeout)
            except TimeoutError:
                log.warning(
                    "replica %d: worker pid %s ignored SIGTERM for %g s; killing it",
                    self.spec.replica_id,
                    self.pid,
                    timeout,
                )
                with contextlib.suppress(ProcessLookupError, OSError):
                    self._process.kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._exited.wait(), timeout)
                if not self._exited.is_set():
                    self._on_exit()  # the watcher never fired; reap by hand (join waits the kill out)
        self._close()
        self._set("stopped")

    def _on_readable(self) -> None:
        try:
            while self._conn is not None and self._conn.poll():
                self._handle(self._conn.recv())
        except (EOFError, OSError):
            # The worker closed its end; the exit watcher reports why.
            if self._conn is not None and self._loop is not None:
                self._loop.remove_reader(self._conn.fileno())

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "ready":
            self.measured_bytes = int(message[1]["measured_bytes"])
            self.info = {k: v for k, v in message[1].items() if k != "measured_bytes"}
            self._idle.set()
            self._set("ready")
        elif kind == "failed":
            self._set("failed", message[1]["reason"])
        elif kind in ("result", "error"):
            future = self._pending.pop(message[1], None)
            self._idle.set()
            if future is None or future.done():
                return
            if kind == "result":
                future.set_result(message[2])
            else:
                error = InferenceInputError if message[3] else InferenceError
                future.set_exception(error(message[2]))
        elif kind != "loading":
            log.warning("replica %d: unknown message %r from worker", self.spec.replica_id, kind)

    def _on_exit(self) -> None:
        if self._exited.is_set():
            return
        self._on_readable()  # a "failed" message may still sit in the pipe: read it before judging the exit
        self._loop.remove_reader(self._process.sentinel)
        self._process.join(1.0)  # the sentinel fires as the process exits; reaping it is immediate
        self.exitcode = self._process.exitcode
        self._exited.set()
        gone = WorkerUnavailable(f"replica {self.spec.replica_id}: worker process {_exit_text(self.exitcode)}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(gone)
        self._pending.clear()
        self._idle.set()  # wake queued callers; they find the state is no longer ready
        if self._stopping:
            return
        if self.state == "failed":
            log.info("replica %d: worker exited after failing (%s)", self.spec.replica_id, _exit_text(self.exitcode))
            return
        was = "while loading" if self.state == "loading" else "while serving"
        self._set("failed", f"worker process {_exit_text(self.exitcode)} {was}")

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._conn.fileno())
            self._conn.close()
            self._conn = None
        if self._process is not None and self._exited.is_set():
            with contextlib.suppress(ValueError):
                self._process.close()

    def _set(self, state: WorkerState, reason: str = "") -> None:
        if state == self.state and reason == self.reason:
            return
        self.state, self.reason = state, reason
        level = logging.WARNING if state == "failed" else logging.INFO
        log.log(level, "replica %d: %s%s", self.spec.replica_id, state, f" ({reason})" if reason else "")
        if self._on_change is not None:
            self._on_change(self)

    def _unavailable_text(self) -> str:
        text = f"replica {self.spec.replica_id} is {self.state}"
        return f"{text}: {self.reason}" if self.reason else text


class Supervisor:
    """The agent's workers by replica id, and the warm spares that new replicas adopt."""

    def __init__(
        self,
        on_change: StatusCallback | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        warm_spares: int = 0,
    ) -> None:
        self._on_change = on_change
        self._stop_timeout = stop_timeout
        self._handles: dict[int, WorkerHandle] = {}
        self.spares = SparePool(warm_spares, stop_timeout)

    def start_spares(self) -> None:
        """Spawn the warm spares; call from the running event loop (spares need it to be watched)."""
        self.spares.fill()

    def start(self, spec: WorkerSpec) -> WorkerHandle:
        """Start a worker for a replica that has none: a warm spare when one waits, else a cold spawn."""
        if spec.replica_id in self._handles:
            raise ValueError(f"replica {spec.replica_id} already has a worker")
        handle = WorkerHandle(spec, self._on_change)
        self._handles[spec.replica_id] = handle
        try:
            handle.start(self.spares.take())
        except OSError as e:  # no process could be made (fd or process limits): report it as the reason
            handle.fail_without_start(f"cannot start a worker process: {e}")
        return handle

    def add_failed(self, spec: WorkerSpec, reason: str) -> WorkerHandle:
        """Track a replica that failed before any process started, so it is reported and served as failed."""
        handle = WorkerHandle(spec, self._on_change)
        self._handles[spec.replica_id] = handle
        handle.fail_without_start(reason)
        return handle

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

    async def stop_all(self) -> None:
        """Stop every worker and every spare, in parallel; no process is left behind and no spare is
        started again (this is the agent's shutdown)."""
        await asyncio.gather(self.spares.close(), *(self.stop(replica_id) for replica_id in list(self._handles)))


def _exit_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "exited with an unknown status"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
