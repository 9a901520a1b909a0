"""The agent's end of one worker process: the process, its connection, its heartbeat, and the answers in
flight (no torch). It keeps no replica state: what the worker says of its lifecycle, and its exit, become
LinkEvents on the one queue the replica manager reads (agent.workers.supervisor).

The connection (the socket pair of a worker this agent started, or the worker's own socket for one it adopted
from a previous agent: agent.workers.rendezvous) is read by a thread of its own, which hands each message to
the event loop: a large result (a 64 MB logits tensor) is unpickled there, not on the loop that answers health
checks and the console. The process sentinel (exit) is watched by the loop; heartbeats are a timer on it.
Several commands and generations may be in flight at once: the worker interleaves them with its generation
steps. `detach()` lets go of a worker without stopping it, for the next agent to adopt.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from agent.workers import rendezvous
from agent.workers.errors import ERROR_KINDS, InferenceError, InferenceTimeout, WorkerUnavailable
from agent.workers.generation_spec import EngineStats, GenerationRequest, GenerationResult, Token
from agent.workers.heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, Heartbeat
from agent.workers.messages import (
    AgentMessage,
    Attach,
    Cancel,
    Command,
    Description,
    Failed,
    Generate,
    Lifecycle,
    Load,
    Loading,
    Ping,
    Pong,
    Progress,
    Ready,
    Refusal,
    Reply,
    Tokens,
    WorkerMessage,
)
from agent.workers.processes import spawn_worker
from agent.workers.spares import Spare
from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.workers.supervisor")

DEADLINE_GRACE = 2.0  # seconds past a generation's deadline before the agent stops waiting for the worker's word


@dataclass(frozen=True)
class Exited:
    """The worker process is gone (and reaped)."""

    exitcode: int | None
    killed_for: str = ""  # why the agent killed it (no heartbeat); "" when it exited or was stopped

    @property
    def text(self) -> str:
        """How it ended, as a person reads it: "exited with code 1", "was killed by signal SIGKILL"."""
        return exit_text(self.exitcode)


@dataclass(frozen=True)
class LinkEvent:
    """Something a worker's link saw happen: a lifecycle message from the worker, or its exit."""

    link: WorkerLink
    what: Lifecycle | Exited


class WorkerLink:
    """One worker process, its pipe and heartbeat; typed messages out, LinkEvents onto `events`."""

    def __init__(
        self,
        replica_id: int,
        events: asyncio.Queue,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    ) -> None:
        self.replica_id = replica_id
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.engine_stats = EngineStats()  # the worker's batcher after its last step
        self.exited = asyncio.Event()
        self._events = events
        # A loaded worker answers pings from its pipe thread; while it starts or loads it may hold the GIL in
        # long C calls (imports, reads), so its silence is judged only once it said it is ready.
        self._loaded = False
        self._heartbeat = Heartbeat(self._ping, self._kill_silent, lambda: self._loaded,
                                    heartbeat_interval, heartbeat_timeout)
        self._kill_reason = ""
        self._stopping = False
        self._process: Any = None
        self._conn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._streams: dict[int, GenerationStream] = {}
        self._ids = itertools.count(1)
        self._inbox: queue.SimpleQueue[WorkerMessage | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self.socket_path: str | None = None  # where the worker waits for the next agent; None: it dies with this one

    @property
    def open_streams(self) -> int:
        """Generations started and not yet ended."""
        return len(self._streams)

    def start(self, spec: WorkerSpec, spare: Spare | None = None, attach: Attach | None = None,
              log_path: str | None = None) -> None:
        """Adopt `spare`, or spawn a worker cold (OSError when no process can be made), and send it its replica;
        with `attach`, the worker outlives this agent; with `log_path`, it writes its output there. Call from the
        event loop that will watch it."""
        self._loop = asyncio.get_running_loop()
        self.socket_path = attach.socket_path if attach is not None else None
        load = Load(spec, attach, log_path)
        if spare is not None:
            try:
                spare.conn.send(load)
            except OSError:  # it died since the pool looked: start cold instead
                spare.conn.close()
                spare.process.join(1.0)
                spare.process.close()
                spare = None
        if spare is not None:
            self._process, conn = spare.process, spare.conn
        else:
            self._process, conn = spawn_worker()
            try:
                conn.send(load)
            except OSError:
                pass  # it died at once: its exit is reported like any other
        self._watch(conn)
        log.info(
            "replica %d: %s worker pid %d for %s on %s",
            spec.replica_id,
            "adopted warm" if spare is not None else "started",
            self.pid,
            spec.model_path,
            spec.device,
        )

    def adopt(self, process: Any, conn: Any, description: Description, socket_path: str) -> None:
        """Take over a worker a previous agent started (agent.workers.rendezvous), over the connection it was
        described on; call from the event loop that will watch it."""
        self._loop = asyncio.get_running_loop()
        self.socket_path = socket_path
        self._ids = itertools.count(description.next_request_id)  # ids the old agent used may still be answered
        self._process = process
        self._watch(conn)
        if description.state in ("ready", "sleeping"):
            self._loaded = True
            self._heartbeat.start()
        log.info("replica %d: adopted worker pid %d (%s) for %s on %s", self.replica_id, self.pid,
                 description.state, description.spec.model_path, description.spec.device)

    def _watch(self, conn: Any) -> None:
        self._conn = conn
        self.pid = self._process.pid
        self._reader = threading.Thread(target=self._read, args=(conn, self._loop), daemon=True,
                                        name=f"modelgrid-replica-{self.replica_id}-pipe")
        self._reader.start()
        self._loop.add_reader(self._process.sentinel, self._on_exit)

    # --- requests -------------------------------------------------------------------------------

    def command(self, kind: str, payload: Any) -> asyncio.Future:
        """Send one command; the future gets its answer (or the InferenceError it failed with)."""
        request_id = next(self._ids)
        future = self._pending[request_id] = self._loop.create_future()
        self._send(Command(kind, request_id, payload), request_id)
        return future

    def generate(self, request: GenerationRequest) -> GenerationStream:
        """Start one sequence in the worker's continuous batcher; its tokens stream as they are made."""
        request_id = next(self._ids)
        stream = self._streams[request_id] = GenerationStream(self, request_id, request.deadline)
        self._send(Generate(request_id, request), request_id)
        return stream

    def cancel(self, request_id: int) -> None:
        """End a generation that is still running (the worker drops it at its next step)."""
        if self._streams.pop(request_id, None) is not None:
            self._send(Cancel(request_id), None)

    def _send(self, message: AgentMessage, request_id: int | None) -> None:
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError, AttributeError) as e:  # AttributeError: the pipe is already closed
            self._pending.pop(request_id, None)
            self._streams.pop(request_id, None)
            raise WorkerUnavailable(f"replica {self.replica_id}: worker pipe closed ({e})") from e

    # --- stopping -------------------------------------------------------------------------------

    async def stop(self, timeout: float) -> None:
        """Terminate the worker (SIGTERM, then SIGKILL after `timeout`), reap it and close the pipe."""
        self._stopping = True
        self._heartbeat.stop()
        if self._process is not None and not self.exited.is_set():
            with contextlib.suppress(ProcessLookupError, OSError):
                self._process.terminate()
            try:
                await asyncio.wait_for(self.exited.wait(), timeout)
            except TimeoutError:
                log.warning(
                    "replica %d: worker pid %s ignored SIGTERM for %g s; killing it", self.replica_id, self.pid, timeout
                )
                with contextlib.suppress(ProcessLookupError, OSError):
                    self._process.kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.exited.wait(), timeout)
                if not self.exited.is_set():
                    self._on_exit()  # the watcher never fired; reap by hand (join waits the kill out)
        self._close()

    async def detach(self) -> None:
        """Let go of the worker without stopping it: it keeps its model and waits for the next agent. What is in
        flight fails here as unavailable; its answers go nowhere."""
        self._stopping = True
        self._heartbeat.stop()
        if self._process is None or self.exited.is_set():
            self._close()
            return
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._process.sentinel)
        if self._conn is not None:
            rendezvous.shutdown(self._conn)  # the worker reads EOF; so does our reader thread, which then ends
            if self._reader is not None:
                await asyncio.to_thread(self._reader.join, 5.0)
            self._conn.close()
            self._conn = None
        self._fail_in_flight(WorkerUnavailable(f"replica {self.replica_id}: the agent is stopping"))
        with contextlib.suppress(ValueError, OSError):
            self._process.close()
        log.info("replica %d: left worker pid %s running for the next agent", self.replica_id, self.pid)

    def _close(self) -> None:
        if self._conn is not None:
            if self._reader is not None:
                self._reader.join(1.0)  # closing the pipe under a reading thread is not safe
            self._conn.close()
            self._conn = None
        if self._process is not None and self.exited.is_set():
            with contextlib.suppress(ValueError):
                self._process.close()

    # --- the pipe and the process ---------------------------------------------------------------

    def _read(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        """The pipe's reader thread: each message to the loop, then None once the worker's end closed."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = None
            self._inbox.put(message)
            try:
                loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                return
            if message is None:
                return

    def _drain(self) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if message is not None:
                self._handle(message)

    def _handle(self, message: WorkerMessage) -> None:
        if isinstance(message, Pong):
            self._heartbeat.pong()
        elif isinstance(message, Tokens):
            for token in message.tokens:
                stream = self._streams.get(token.request_id)
                if stream is not None:
                    stream.put(token)
            self.engine_stats = message.stats
        elif isinstance(message, Reply | Refusal):
            self._answer(message)
        elif isinstance(message, Loading | Progress | Ready | Failed):
            if isinstance(message, Ready):
                self._loaded = True
                self._heartbeat.start()
            self._events.put_nowait(LinkEvent(self, message))
        else:
            log.warning("replica %d: unknown message %s from worker", self.replica_id, type(message).__name__)

    def _answer(self, message: Reply | Refusal) -> None:
        """A command's answer to its caller, or a generation's end to its stream."""
        if isinstance(message, Reply):
            outcome: Any = message.value
        else:
            outcome = ERROR_KINDS.get(message.kind, InferenceError)(message.text)
        stream = self._streams.pop(message.request_id, None)
        if stream is not None:
            stream.put(outcome)
            return
        future = self._pending.pop(message.request_id, None)
        if future is None or future.done():
            return
        if isinstance(message, Reply):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)

    def _ping(self, number: int) -> None:
        if self._conn is not None and not self.exited.is_set() and not self._stopping:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(Ping(number))

    def _kill_silent(self, reason: str) -> None:
        if self.exited.is_set() or self._stopping:
            return
        self._kill_reason = reason
        log.warning("replica %d: worker pid %s: %s; killing it", self.replica_id, self.pid, reason)
        with contextlib.suppress(ProcessLookupError, OSError):
            self._process.kill()

    def _on_exit(self) -> None:
        if self.exited.is_set():
            return
        if self._reader is not None:
            self._reader.join(1.0)  # the pipe reads EOF once the process is gone
        self._drain()  # a Failed message may still sit in the pipe: it is heard before the exit
        self._heartbeat.stop()
        self._loop.remove_reader(self._process.sentinel)
        self._process.join(1.0)  # the sentinel fires as the process exits; reaping it is immediate
        self.exitcode = self._process.exitcode
        self.exited.set()
        # The exit is queued before the callers below are woken, so the replica manager has marked the
        # replica failed by the time a caller looks at it.
        self._events.put_nowait(LinkEvent(self, Exited(self.exitcode, self._kill_reason)))
        if self.socket_path is not None:  # killed, it could not remove its socket itself
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        self._fail_in_flight(WorkerUnavailable(f"replica {self.replica_id}: worker process {exit_text(self.exitcode)}"))

    def _fail_in_flight(self, error: InferenceError) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        self.engine_stats = EngineStats()


def exit_text(exitcode: int | None) -> str:
    """A process's end as a person reads it."""
    if exitcode is None:
        return "exited with an unknown status"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class GenerationStream:
    """One generation's tokens as the worker makes them; `result` once it ended. Iterate it to the end, or
    `close()` it to cancel the sequence in the worker (at its next step)."""

    def __init__(self, link: WorkerLink, request_id: int, deadline: float | None) -> None:
        self._link, self._id, self._deadline = link, request_id, deadline
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self.result: GenerationResult | None = None
        self.replica_id = link.replica_id

    def put(self, item: Any) -> None:
        self._items.put_nowait(item)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> Token:
        if self.result is not None:
            raise StopAsyncIteration
        try:
            # The worker ends a sequence at its deadline; this backstop covers a worker that stopped stepping.
            left = None if self._deadline is None else self._deadline - time.monotonic() + DEADLINE_GRACE
            async with asyncio.timeout(left):
                item = await self._items.get()
        except TimeoutError:
            self.close()
            raise InferenceTimeout(f"replica {self.replica_id} did not finish the generation by its deadline") from None
        if isinstance(item, Token):
            return item
        if isinstance(item, BaseException):
            self.result = GenerationResult((), "stop")  # ended: nothing more to cancel
            raise item
        self.result = item
        raise StopAsyncIteration

    def close(self) -> None:
        """Cancel the sequence unless it already ended (idempotent)."""
        if self.result is None:
            self.result = GenerationResult((), "stop")
            with contextlib.suppress(InferenceError):
                self._link.cancel(self._id)
