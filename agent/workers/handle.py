"""One replica as the agent knows it: its record (state, reason, measurement, adapters, sleep figures) and
the commands that go to its worker through its link (agent.workers.link). No torch, no threads.

Only the replica manager changes the record: the supervisor applies what the link reports (`apply`, from
its one event queue), and the manager's own calls (sleep, wake, promote, demote, stop) change it here and
announce the change on that same queue, so the supervisor's listener hears of every change, in order.

States: pending -> starting (process up, importing) -> loading (reading weights, with progress) ->
ready | preloaded (on the device, not serving) <-> sleeping (weights in host memory) -> stopped,
or failed with a reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from agent.protocol import LIVE_STATES, ON_DEVICE, AdapterStatus, Measurement, ReplicaStatus, SleepWake
from agent.protocol.messages import ReplicaState
from agent.workers.errors import InferenceError, InferenceTimeout, WorkerUnavailable
from agent.workers.generation_spec import EngineStats, GenerationRequest
from agent.workers.heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from agent.workers.link import Exited, GenerationStream, WorkerLink
from agent.workers.messages import Attach, Description, Failed, Lifecycle, Loading, Progress, Ready
from agent.workers.spares import Spare
from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.workers.supervisor")

WorkerState = ReplicaState  # a worker's states are the replica states the protocol reports

DEFAULT_STOP_TIMEOUT = 5.0
DEFAULT_INFER_TIMEOUT = 120.0
DEFAULT_SWAP_TIMEOUT = 600.0  # a sleep or wake copies every weight; big models on slow buses take a while


@dataclass(frozen=True)
class Changed:
    """A replica's record changed by the manager's own call (the supervisor tells whoever listens)."""

    handle: WorkerHandle


class WorkerHandle:
    """One replica: what the agent knows about it, and its worker's commands."""

    def __init__(
        self,
        spec: WorkerSpec,
        events: asyncio.Queue,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    ) -> None:
        self.spec = spec
        # The replica manager's one queue: the link's events go there, and so does each change made here.
        self._events = events
        self.link = WorkerLink(spec.replica_id, self._events, heartbeat_interval, heartbeat_timeout)
        self.state: WorkerState = "pending"  # until start()
        self.reason = ""
        self.after_load: Literal["ready", "preloaded"] = "ready"  # where a finished load lands
        self.measurement: Measurement | None = None
        self.info: dict[str, Any] = {}  # what the worker said about its model when ready
        self.loaded_bytes: int | None = None
        self.total_bytes: int | None = None
        self.host_bytes = 0  # host memory holding its weights while asleep
        self.sleep_wake: SleepWake | None = None
        self.last_used = time.monotonic()  # for least-recently-used eviction of sleeping replicas
        self.transition: str | None = None  # "sleep" or "wake" while one runs
        # Leaving (stopped, moved, put to sleep): it takes no new requests while those it has finish (drained()).
        self.draining = False
        self.picked = 0  # requests routed to it and not yet answered (in the serving batcher or the worker)
        self._calls = 0  # commands waiting or running (generations are counted by the link)
        self._stopping = False
        self._wake_task: asyncio.Task | None = None
        self._sleep_task: asyncio.Task | None = None
        # LoRA adapters: the names the console wants served (what requests may ask for), what the
        # worker's pool reported last, and why the last change was refused, if it was.
        self.adapters: set[str] = set()
        self.adapter_stats: list[AdapterStatus] = []
        self.adapter_error = ""
        self.adapter_failures: dict[str, str] = {}  # adapter -> why its worker could not load it (answered to requests)
        self.adapter_config: dict[str, Any] | None = None  # what its pool last took from the placement
        self.batching: Any = None  # this replica's dynamic-batching settings (agent.serving.batching)

    @property
    def measured_bytes(self) -> int | None:
        return self.measurement.total_bytes if self.measurement is not None else None

    @property
    def pid(self) -> int | None:
        return self.link.pid

    @property
    def device_pids(self) -> list[int]:
        """The processes that hold this replica's memory: its worker, and an engine's own (vLLM's)."""
        return ([self.pid] if self.pid else []) + [int(p) for p in self.info.get("pids", ())]

    @property
    def exitcode(self) -> int | None:
        return self.link.exitcode

    @property
    def queued(self) -> int:
        """Commands and generations waiting or running, for least-busy routing."""
        return self._calls + self.link.open_streams

    async def drained(self, timeout: float, poll: float = 0.05) -> bool:
        """Take no new requests, and wait up to `timeout` s for those it has to finish; False when some were
        still running at the deadline (they end with the worker)."""
        self.draining = True
        deadline = time.monotonic() + timeout
        while self.picked or self.queued:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True

    @property
    def engine_stats(self) -> EngineStats:
        """The worker's batcher after its last step."""
        return self.link.engine_stats

    def start(self, spare: Spare | None = None, attach: Attach | None = None, log_path: str | None = None) -> None:
        """Adopt `spare`, or spawn a worker cold (with `attach`, one that outlives this agent; with `log_path`, one
        that writes its output there); call from the event loop that will watch it."""
        self.link.start(self.spec, spare, attach, log_path)
        self._set("starting")

    def adopt(self, process: Any, conn: Any, description: Description, socket_path: str) -> None:
        """Take over a worker a previous agent left running, as it described itself: no reload."""
        self.link.adopt(process, conn, description, socket_path)
        if description.measurement is not None:
            self.measurement = Measurement(**description.measurement)
            self.info = dict(description.info)
            self.info["load_seconds"] = self.measurement.load_seconds
        self.loaded_bytes, self.total_bytes = description.loaded_bytes, description.total_bytes
        if description.state == "sleeping":
            self.host_bytes = description.host_bytes
        if description.sleep_wake is not None:
            self.sleep_wake = SleepWake(**description.sleep_wake)
        self.last_used = time.monotonic()
        state = description.state if description.state in ("starting", "loading", "sleeping") else "ready"
        self._set(state)

    async def detach(self) -> None:
        """Leave the worker running, for the next agent to adopt; this record is done with."""
        self._stopping = True
        await self.link.detach()

    def fail_without_start(self, reason: str) -> None:
        """Record a replica that cannot even be started (its model directory is unusable)."""
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

    # --- what the link reports (applied by the supervisor) --------------------------------------

    def apply(self, what: Lifecycle | Exited) -> bool:
        """Apply what this replica's link reported; True when its state changed (False: progress only, or
        nothing). Called by the replica manager alone (agent.workers.supervisor)."""
        if isinstance(what, Progress):
            self.loaded_bytes, self.total_bytes = what.loaded_bytes, what.total_bytes
            return False
        if isinstance(what, Loading):
            self.total_bytes = what.total_bytes or None
            self.loaded_bytes = 0
            return self._become("loading")
        if isinstance(what, Ready):
            self.measurement = Measurement(**what.measurement)
            self.info = dict(what.info)
            self.info["load_seconds"] = self.measurement.load_seconds  # for the agent's /metrics
            self.loaded_bytes = self.total_bytes
            self.last_used = time.monotonic()
            return self._become(self.after_load)
        if isinstance(what, Failed):
            return self._become("failed", what.reason)
        return self._exited(what)

    def _exited(self, ended: Exited) -> bool:
        if self._stopping:
            return False  # stop() records the end itself
        if self.state == "failed":
            log.info("replica %d: worker exited after failing (%s)", self.spec.replica_id, ended.text)
            return False
        if ended.killed_for:
            return self._become("failed", ended.killed_for)
        was = {"starting": "while starting", "loading": "while loading", "sleeping": "while sleeping"}
        return self._become("failed", f"worker process {ended.text} {was.get(self.state, 'while serving')}")

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
        return self.link.generate(request)

    async def configure_adapters(self, payload: dict[str, Any], timeout: float = DEFAULT_INFER_TIMEOUT) -> None:
        """Load/unload/pin adapters and pass demand hints (agent.workers.runtime.configure_adapters)."""
        self._take_adapter_stats(await self.call("adapters", payload, timeout, states=ON_DEVICE))

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
        # A batch mixes only adapters on the device: as many as its tier holds of the largest it serves.
        largest = max((a.nbytes for a in self.adapter_stats), default=0)
        on_device = sum(1 for a in self.adapter_stats if a.tier == "gpu")
        budget = totals.get("gpu_budget", 0)
        self.info["max_loras"] = max(on_device, budget // largest if largest else 0)
        if "errors" in result:  # a change was applied: its refusals replace the last change's
            self.adapter_error = "; ".join(result["errors"])
            self.adapter_failures = dict(result.get("failures", {}))

    async def call(
        self,
        kind: str,
        payload: Any = None,
        timeout: float = DEFAULT_INFER_TIMEOUT,
        states: tuple[str, ...] = ("ready",),
    ) -> Any:
        """Run one worker command (see agent.workers.process) while the worker is in one of `states`."""
        self._calls += 1
        try:
            async with asyncio.timeout(timeout):
                future = self._submit(kind, payload, states)
                # Shielded: if this caller gives up, the worker still answers, and that answer is what
                # marks the worker idle again (see _submit).
                return await asyncio.shield(future)
        except TimeoutError:
            what = "" if kind == "infer" else f" {kind}"
            text = f"replica {self.spec.replica_id} did not answer{what} within {timeout:g} s"
            raise InferenceTimeout(text) from None
        finally:
            self._calls -= 1

    def _submit(self, kind: str, payload: Any, states: tuple[str, ...]) -> asyncio.Future:
        own_transition = {"sleep": "sleep", "wake": "wake"}.get(kind)
        self._check_serving(states, own_transition)
        return self.link.command(kind, payload)

    def _check_serving(self, states: tuple[str, ...], own_transition: str | None) -> None:
        if self.state not in states or (self.transition is not None and self.transition != own_transition):
            raise WorkerUnavailable(self._unavailable_text())

    # --- sleep and wake -------------------------------------------------------------------------

    async def sleep(self, timeout: float = DEFAULT_SWAP_TIMEOUT) -> None:
        """Move the weights to host memory and free the device; concurrent callers share one sleep."""
        if self._sleep_task is None:
            if self.state == "sleeping" and self.transition is None:
                return
            if self.state not in ON_DEVICE or self.transition is not None:
                raise WorkerUnavailable(f"cannot sleep: {self._unavailable_text()}")
            self.transition = "sleep"  # requests arriving from now on are refused, not queued behind it
            self._sleep_task = asyncio.ensure_future(self._sleep(timeout))
            self._sleep_task.add_done_callback(self._transition_done)
        await asyncio.shield(self._sleep_task)

    async def _sleep(self, timeout: float) -> None:
        try:
            result = await self.call("sleep", None, timeout, states=ON_DEVICE)
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
            if self.state in ON_DEVICE and self.transition is None:
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

    # --- lifecycle ------------------------------------------------------------------------------

    async def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT, reason: str = "") -> None:
        """Terminate the worker (SIGTERM, then SIGKILL after `timeout`), reap it, and mark it stopped (with why)."""
        self._stopping = True
        await self.link.stop(timeout)
        self._set("stopped", reason)

    def _set(self, state: WorkerState, reason: str = "") -> None:
        """A change made by the manager's own call: recorded, and announced on the manager's queue."""
        if self._become(state, reason):
            self._events.put_nowait(Changed(self))

    def _become(self, state: WorkerState, reason: str = "") -> bool:
        if state == self.state and reason == self.reason:
            return False
        self.state, self.reason = state, reason
        level = logging.WARNING if state == "failed" else logging.INFO
        log.log(level, "replica %d: %s%s", self.spec.replica_id, state, f" ({reason})" if reason else "")
        return True

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
