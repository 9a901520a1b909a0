"""One worker process as the daemon sees it: state, commands, heartbeat, exit (no torch, no threads).

The worker's pipe is read by a thread of its own, which hands each message to the event loop: a large
result (a 64 MB logits tensor) is unpickled there, not on the loop that answers health checks and the
console. The process sentinel (exit) is watched by the loop; heartbeats are a timer on it. Several
commands may be in flight at once: the worker interleaves them with its generation steps.

States: pending -> starting (process up, importing) -> loading (reading weights, with progress) ->
ready | preloaded (on the device, not serving) <-> sleeping (weights in host memory) -> stopped,
or failed with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from agent.protocol import AdapterStatus, Measurement, ReplicaStatus, SleepWake
from agent.protocol.messages import ReplicaState
from agent.workers.errors import ERROR_KINDS, InferenceError, InferenceTimeout, WorkerUnavailable
from agent.workers.generation_spec import EngineStats, GenerationRequest, GenerationResult, Token
from agent.workers.heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, Heartbeat
from agent.workers.spares import Spare, spawn_worker
from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.workers.supervisor")

WorkerState = ReplicaState  # a worker's states are the replica states the protocol reports
StatusCallback = Callable[["WorkerHandle"], None]

DEFAULT_STOP_TIMEOUT = 5.0
DEFAULT_INFER_TIMEOUT = 120.0
DEADLINE_GRACE = 2.0  # seconds past a generation's deadline before the agent stops waiting for the worker's word
DEFAULT_SWAP_TIMEOUT = 600.0  # a sleep or wake copies every weight; big models on slow buses take a while
# A loaded worker answers pings from its pipe thread; while it starts or loads it may hold the GIL in
# long C calls (imports, reads), so only these states are watched.
WATCHED_STATES = ("ready", "preloaded", "sleeping")
LIVE_STATES = ("starting", "loading", "ready", "preloaded", "sleeping")


class WorkerHandle:
    """One worker process and what the agent knows about it."""

    def __init__(
        self,
        spec: WorkerSpec,
        on_change: StatusCallback | None = None,
        on_progress: StatusCallback | None = None,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    ) -> None:
        self.spec = spec
        self.state: WorkerState = "pending"  # until start()
        self.reason = ""
        self.after_load: Literal["ready", "preloaded"] = "ready"  # where a finished load lands
        self.measurement: Measurement | None = None
        self.info: dict[str, Any] = {}  # what the worker said about its model when ready
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.queued = 0  # commands and generations waiting or running, for least-busy routing
        self.engine_stats = EngineStats()  # the worker's batcher after its last step
        self.loaded_bytes: int | None = None
        self.total_bytes: int | None = None
        self.host_bytes = 0  # host memory holding its weights while asleep
        self.sleep_wake: SleepWake | None = None
        self.last_used = time.monotonic()  # for least-recently-used eviction of sleeping replicas
        self.transition: str | None = None  # "sleep" or "wake" while one runs
        self._on_change = on_change
        self._on_progress = on_progress
        self._heartbeat = Heartbeat(self._ping, self._kill_silent, lambda: self.state in WATCHED_STATES,
                                    heartbeat_interval, heartbeat_timeout)
        self._kill_reason = ""
        self._process: Any = None
        self._conn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._streams: dict[int, GenerationStream] = {}
        self._ids = itertools.count(1)
        self._inbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._exited = asyncio.Event()
        self._stopping = False
        self._wake_task: asyncio.Task | None = None
        self._sleep_task: asyncio.Task | None = None
        # LoRA adapters: the names the console wants served (what requests may ask for), what the
        # worker's pool reported last, and why the last change was refused, if it was.
        self.adapters: set[str] = set()
        self.adapter_stats: list[AdapterStatus] = []
        self.adapter_error = ""
        self.adapter_config: dict[str, Any] | None = None  # what its pool last took from the placement
        self.batching: Any = None  # this replica's dynamic-batching settings (agent.serving.batching)

    @property
    def measured_bytes(self) -> int | None:
        return self.measurement.total_bytes if self.measurement is not None else None

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
        self._reader = threading.Thread(target=self._read, args=(parent_conn, self._loop), daemon=True,
                                        name=f"modelgrid-replica-{self.spec.replica_id}-pipe")
        self._reader.start()
        self._loop.add_reader(self._process.sentinel, self._on_exit)
        log.info(
            "replica %d: %s worker pid %d for %s on %s",
            self.spec.replica_id,
            "adopted warm" if spare is not None else "started",
            self.pid,
            self.spec.model_path,
            self.spec.device,
        )
        self._set("starting")

    def fail_without_start(self, reason: str) -> None:
        """Record a replica that cannot even be started (its model directory is unusable)."""
        self._exited.set()
        self._set("failed", reason)

    def status(self) -> ReplicaStatus:
        """This replica as the wire protocol reports it."""
        return ReplicaStatus(
            replica_id=self.spec.replica_id,
            state=self.state,
            measured_bytes=self.measured_bytes,
            loaded_bytes=self.loaded_bytes,
            total_bytes=self.total_bytes,
            reason=self.reason,
            pid=self.pid if self.state in LIVE_STATES else None,
            measurement=self.measurement,
            sleep_wake=self.sleep_wake,
            host_bytes=self.host_bytes if self.state == "sleeping" else None,
            mps_percentage=self.spec.mps_percentage,
            adapters=self.adapter_stats,
            adapter_error=self.adapter_error,
        )

    # --- commands -------------------------------------------------------------------------------

    async def infer(
        self, inputs: dict[str, Any], adapters: list[str | None] | None = None, timeout: float = DEFAULT_INFER_TIMEOUT
    ) -> dict[str, Any]:
        """Run one batch on the worker, row i with adapters[i] (None: the base model); concurrent callers
        queue. Raises InferenceError subclasses."""
        self.last_used = time.monotonic()
        if adapters is None or all(a is None for a in adapters):
            return await self.call("infer", inputs, timeout)
        return await self.call("infer_mixed", {"inputs": inputs, "adapters": adapters}, timeout)

    def generate(self, request: GenerationRequest) -> GenerationStream:
        """Start one sequence in the worker's continuous batcher; its tokens stream as they are made.
        WorkerUnavailable at once when the replica is not ready. Close the stream to cancel it."""
        self.last_used = time.monotonic()
        self._check_serving(("ready",), None)
        request_id = next(self._ids)
        stream = self._streams[request_id] = GenerationStream(self, request_id, request.deadline)
        self.queued += 1
        self._send(("generate", request_id, request), request_id)
        return stream

    def _cancel(self, request_id: int) -> None:
        if self._streams.pop(request_id, None) is not None:
            self.queued -= 1
            self._send(("cancel", request_id, None), None)

    async def configure_adapters(self, payload: dict[str, Any], timeout: float = DEFAULT_INFER_TIMEOUT) -> None:
        """Load/unload/pin adapters and pass demand hints (agent.workers.runtime.configure_adapters)."""
        self._take_adapter_stats(await self.call("adapters", payload, timeout, states=("ready", "preloaded")))

    async def refresh_adapter_stats(self, timeout: float = DEFAULT_INFER_TIMEOUT) -> None:
        """Read the adapter pool's figures (requests, hits, tiers) without changing it."""
        self._take_adapter_stats(await self.call("adapter_stats", None, timeout))

    def _take_adapter_stats(self, result: dict[str, Any]) -> None:
        stats = result["stats"]
        self.adapter_stats = [
            AdapterStatus(name=a["name"], tier=a["tier"], pinned=a["pinned"], nbytes=a["nbytes"],
                          requests=a["requests"], hits=a["hits"], misses=a["misses"])
            for a in stats["adapters"]
        ]
        totals = stats["totals"]
        self.info["adapters"] = {"hits": totals["hits"], "misses": totals["misses"],
                                 "evictions": totals["evictions"], "loaded": totals["adapters"]}
        if "errors" in result:
            self.adapter_error = "; ".join(result["errors"])

    async def call(
        self,
        kind: str,
        payload: Any = None,
        timeout: float = DEFAULT_INFER_TIMEOUT,
        states: tuple[str, ...] = ("ready",),
    ) -> Any:
        """Run one worker command (see agent.workers.process) while the worker is in one of `states`."""
        self.queued += 1
        try:
            async with asyncio.timeout(timeout):
                future = await self._submit(kind, payload, states)
                # Shielded: if this caller gives up, the worker still answers, and that answer is what
                # marks the worker idle again (see _submit).
                return await asyncio.shield(future)
        except TimeoutError:
            what = "" if kind == "infer" else f" {kind}"
            text = f"replica {self.spec.replica_id} did not answer{what} within {timeout:g} s"
            raise InferenceTimeout(text) from None
        finally:
            self.queued -= 1

    async def sleep(self, timeout: float = DEFAULT_SWAP_TIMEOUT) -> None:
        """Move the weights to host memory and free the device; concurrent callers share one sleep."""
        if self._sleep_task is None:
            if self.state == "sleeping" and self.transition is None:
                return
            if self.state not in ("ready", "preloaded") or self.transition is not None:
                raise WorkerUnavailable(f"cannot sleep: {self._unavailable_text()}")
            self.transition = "sleep"  # requests arriving from now on are refused, not queued behind it
            self._sleep_task = asyncio.ensure_future(self._sleep(timeout))
            self._sleep_task.add_done_callback(self._transition_done)
        await asyncio.shield(self._sleep_task)

    async def _sleep(self, timeout: float) -> None:
        try:
            result = await self.call("sleep", None, timeout, states=("ready", "preloaded"))
        finally:
            self.transition = None
        self.host_bytes = int(result["host_bytes"])
        self.sleep_wake = _sleep_wake(result)
        self._set("sleeping")

    def _transition_done(self, task: asyncio.Task) -> None:
        """A sleep or wake ended: the next caller starts a new one."""
        if task is self._sleep_task:
            self._sleep_task = None
        if task is self._wake_task:
            self._wake_task = None
        if not task.cancelled():
            task.exception()  # retrieved here so an unawaited failure is not logged as lost

    async def wake(self, then: Literal["ready", "preloaded"] = "ready", timeout: float = DEFAULT_SWAP_TIMEOUT) -> None:
        """Copy the weights back onto the device and end in `then`; concurrent callers share one wake."""
        if self._wake_task is None:
            if self.state in ("ready", "preloaded") and self.transition is None:
                if then == "ready":
                    self.promote()
                return
            if self.state != "sleeping":
                raise WorkerUnavailable(f"cannot wake: {self._unavailable_text()}")
            self._wake_task = asyncio.ensure_future(self._wake(then, timeout))
            self._wake_task.add_done_callback(self._transition_done)
        await asyncio.shield(self._wake_task)
        if then == "ready":
            self.promote()  # another caller woke it into preloaded; this one needs it serving

    def promote(self) -> None:
        """Preloaded -> ready: it is on the device already, so it serves at once (not while it goes to sleep)."""
        if self.state == "preloaded" and self.transition is None:
            self._set("ready")

    def demote(self) -> None:
        """Ready -> preloaded: stays on the device, takes no new requests."""
        if self.state == "ready" and self.transition is None:
            self._set("preloaded")

    async def _wake(self, then: str, timeout: float) -> None:
        self.transition = "wake"
        try:
            result = await self.call("wake", None, timeout, states=("sleeping",))
        except InferenceError as e:
            if self.state == "sleeping":  # still alive, weights still in host memory: say why it sleeps on
                self._set("sleeping", f"cannot wake: {e}")
            raise
        finally:
            self.transition = None
        self.host_bytes = 0
        self.sleep_wake = _sleep_wake(result)
        self.info["wake_seconds"] = self.sleep_wake.seconds  # for the agent's /metrics
        self.last_used = time.monotonic()
        self._set(then)

    async def _submit(self, kind: str, payload: Any, states: tuple[str, ...]) -> asyncio.Future:
        own_transition = {"sleep": "sleep", "wake": "wake"}.get(kind)
        self._check_serving(states, own_transition)
        request_id = next(self._ids)
        future = self._pending[request_id] = self._loop.create_future()
        self._send((kind, request_id, payload), request_id)
        return future

    def _check_serving(self, states: tuple[str, ...], own_transition: str | None) -> None:
        if self.state not in states or (self.transition is not None and self.transition != own_transition):
            raise WorkerUnavailable(self._unavailable_text())

    def _send(self, message: tuple, request_id: int | None) -> None:
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError, AttributeError) as e:  # AttributeError: the pipe is already closed
            self._pending.pop(request_id, None)
            if self._streams.pop(request_id, None) is not None:
                self.queued -= 1
            raise WorkerUnavailable(f"replica {self.spec.replica_id}: worker pipe closed ({e})") from e

    # --- lifecycle ------------------------------------------------------------------------------

    async def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT, reason: str = "") -> None:
        """Terminate the worker (SIGTERM, then SIGKILL after `timeout`), reap it, and mark it stopped (with why)."""
        self._stopping = True
        self._heartbeat.stop()
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
        self._set("stopped", reason)

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

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "pong":
            self._heartbeat.pong()
        elif kind == "progress":
            self.loaded_bytes = int(message[1]["loaded_bytes"])
            self.total_bytes = int(message[1]["total_bytes"])
            if self._on_progress is not None:
                self._on_progress(self)
        elif kind == "loading":
            self.total_bytes = int(message[1].get("total_bytes", 0)) or None
            self.loaded_bytes = 0
            self._set("loading")
        elif kind == "ready":
            self.measurement = Measurement(**message[1]["measurement"])
            self.info = {k: v for k, v in message[1].items() if k not in ("measured_bytes", "measurement")}
            self.info["load_seconds"] = self.measurement.load_seconds  # for the agent's /metrics
            self.loaded_bytes = self.total_bytes
            self.last_used = time.monotonic()
            self._heartbeat.start()
            self._set(self.after_load)
        elif kind == "failed":
            self._set("failed", message[1]["reason"])
        elif kind == "tokens":
            for token in message[1]:
                stream = self._streams.get(token.request_id)
                if stream is not None:
                    stream.put(token)
            self.engine_stats = message[2]
        elif kind in ("result", "error") and message[1] in self._streams:
            self.queued -= 1
            stream = self._streams.pop(message[1])
            stream.put(message[2] if kind == "result" else ERROR_KINDS.get(message[3], InferenceError)(message[2]))
        elif kind in ("result", "error"):
            future = self._pending.pop(message[1], None)
            if future is None or future.done():
                return
            if kind == "result":
                future.set_result(message[2])
            else:
                future.set_exception(ERROR_KINDS.get(message[3], InferenceError)(message[2]))
        else:
            log.warning("replica %d: unknown message %r from worker", self.spec.replica_id, kind)

    def _ping(self, number: int) -> None:
        if self._conn is not None and not self._exited.is_set() and not self._stopping:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("ping", number))

    def _kill_silent(self, reason: str) -> None:
        if self._exited.is_set() or self._stopping:
            return
        self._kill_reason = reason
        log.warning("replica %d: worker pid %s: %s; killing it", self.spec.replica_id, self.pid, reason)
        with contextlib.suppress(ProcessLookupError, OSError):
            self._process.kill()

    def _on_exit(self) -> None:
        if self._exited.is_set():
            return
        if self._reader is not None:
            self._reader.join(1.0)  # the pipe reads EOF once the process is gone
        self._drain()  # a "failed" message may still sit in the pipe: read it before judging the exit
        self._heartbeat.stop()
        self._loop.remove_reader(self._process.sentinel)
        self._process.join(1.0)  # the sentinel fires as the process exits; reaping it is immediate
        self.exitcode = self._process.exitcode
        self._exited.set()
        gone = WorkerUnavailable(f"replica {self.spec.replica_id}: worker process {_exit_text(self.exitcode)}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(gone)
        self._pending.clear()
        for stream in self._streams.values():
            stream.put(gone)
        self.queued -= len(self._streams)
        self._streams.clear()
        self.engine_stats = EngineStats()
        if self._stopping:
            return
        if self.state == "failed":
            log.info("replica %d: worker exited after failing (%s)", self.spec.replica_id, _exit_text(self.exitcode))
            return
        if self._kill_reason:
            self._set("failed", self._kill_reason)
            return
        was = {"starting": "while starting", "loading": "while loading", "sleeping": "while sleeping"}
        self._set("failed", f"worker process {_exit_text(self.exitcode)} {was.get(self.state, 'while serving')}")

    def _close(self) -> None:
        if self._conn is not None:
            if self._reader is not None:
                self._reader.join(1.0)  # closing the pipe under a reading thread is not safe
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
        if self.transition == "sleep":
            return f"replica {self.spec.replica_id} is going to sleep"
        if self.transition == "wake":
            return f"replica {self.spec.replica_id} is waking up"
        text = f"replica {self.spec.replica_id} is {self.state}"
        return f"{text}: {self.reason}" if self.reason else text


def _sleep_wake(result: dict[str, Any]) -> SleepWake:
    return SleepWake(
        direction=result["direction"],
        bytes=int(result["bytes"]),
        seconds=float(result["seconds"]),
        bandwidth=float(result["bandwidth"]) or None,
    )


def _exit_text(exitcode: int | None) -> str:
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

    def __init__(self, handle: WorkerHandle, request_id: int, deadline: float | None) -> None:
        self._handle, self._id, self._deadline = handle, request_id, deadline
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self.result: GenerationResult | None = None
        self.replica_id = handle.spec.replica_id

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
                self._handle._cancel(self._id)
