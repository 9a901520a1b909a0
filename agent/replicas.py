"""The agent's replicas: converge workers to a desired state and keep them there (no torch).

Applies a convergence plan (agent.converge) phase by phase, restarts crashed workers with backoff,
keeps sleeping replicas inside the host-RAM budget (agent.sleep_budget), and charges each GPU what its
replicas measured. Replicas wake, load and sleep only as the desired state says: never for a request.

With a state directory, workers outlive the agent: `open()` adopts what a previous agent left running before
the first desired state is applied, which then keeps each adopted worker whose model still matches (no reload)
and stops the rest; `detach_all()` leaves them running for the next agent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from agent import engines
from agent.artifacts import ArtifactError
from agent.artifacts.capability import device_kind
from agent.artifacts.model_dir import CAUSAL_LM_SUFFIXES, SAFETENSORS
from agent.converge import Running, device_for, plan_convergence
from agent.gpus import GpuBackend
from agent.protocol import ENDED, LOADED, ON_DEVICE, DesiredReplica, DesiredState, GpuInfo
from agent.restarts import STABLE_S, RestartBackoff
from agent.serving.batching import BatchSettings
from agent.sleep_budget import Sleeper, fit
from agent.workers.errors import InferenceError
from agent.workers.handle import DEFAULT_INFER_TIMEOUT, DEFAULT_SWAP_TIMEOUT
from agent.workers.heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from agent.workers.rendezvous import DEFAULT_ORPHAN_TIMEOUT, WorkerDirectory
from agent.workers.spec import DTYPES, WorkerSpec
from agent.workers.supervisor import DEFAULT_WARM_SPARES, Supervisor, WorkerHandle

log = logging.getLogger("agent.daemon")

Notify = Callable[[WorkerHandle, bool], None]  # (handle, progress only)
# Address space a capped CPU worker may use beyond its reservation and its checkpoint (mapped while it is
# read; a sleeping CPU replica's host copy takes as much again while its weights are released): the second
# malloc arena (64 MiB; limits.CAPPED_ARENAS), transformers' loading threads (up to 4 stacks of 8 MiB),
# modules imported during the load, and the allocator's fragmentation.
CPU_CAP_SLACK = 256 * 1024 * 1024
# ... and per torch thread, for the buffers kernels take per thread (the threads' stacks are in the worker's
# baseline: agent.workers.limits starts the thread pool before it caps the address space).
CPU_CAP_PER_THREAD = 16 * 1024 * 1024
DEFAULT_ADAPTER_POOL_BYTES = 256 * 1024 * 1024  # device tier when the console names no budget
ADOPTION_TIMEOUT = 10.0  # seconds an adopted worker gets to list its adapters before the agent goes on without
DEFAULT_DRAIN_TIMEOUT = 30.0


@dataclass(frozen=True)
class ReplicaSettings:
    warm_workers: int = DEFAULT_WARM_SPARES  # spawned workers kept with torch imported, for fast starts
    restart_backoff_min: float = 1.0  # a crashed worker is restarted after this, doubling per crash
    restart_backoff_max: float = 60.0
    restart_stable_s: float = STABLE_S  # a worker ready this long ends its replica's run of failures
    sleep_budget: int | None = None  # host bytes for sleeping replicas; None: half the host's RAM
    swap_timeout: float = DEFAULT_SWAP_TIMEOUT
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT  # a loaded worker silent this long is killed and replaced
    cap_cpu_workers: bool = True  # hold CPU workers to their reservation with an address-space cap
    cpu_threads: int | None = None  # torch threads per CPU worker; None: the host's cores shared (cpu_thread_share)
    state_dir: str | None = None  # where replica workers wait for the next agent; None: they die with this one
    orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT  # seconds a worker without an agent waits before it exits
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # a replica leaving finishes its requests within this, then goes
    engine_programs: dict[str, str] = field(default_factory=dict)  # by engine: what it runs here (Engine.program)


def host_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_thread_share(cores: int, gpus: int, replicas: int) -> int:
    """Torch threads for one CPU worker: the host's cores divided among the simulated GPUs, or among the
    replicas when more replicas than GPUs are placed here, so that the workers together do not
    oversubscribe the cores (several busy workers each with a thread per core spend their time in OpenMP
    barriers); at least 1."""
    return max(1, cores // max(1, gpus, replicas))


def cpu_memory_limit(reserved_bytes: int, file_bytes: int, threads: int) -> int:
    """Address space a CPU worker may use beyond its baseline: its reservation, its checkpoint, and headroom."""
    return reserved_bytes + file_bytes + CPU_CAP_SLACK + max(1, threads) * CPU_CAP_PER_THREAD


def sleep_bytes(handle: WorkerHandle) -> int:
    """Host memory a replica holds asleep, or would hold: its host copy, else its measured weights."""
    return handle.host_bytes or (handle.measurement.weights_bytes if handle.measurement else 0)


def default_sleep_budget() -> int:
    """Half of this host's RAM."""
    return psutil.virtual_memory().total // 2


class Replicas:
    """Every replica of this host: its worker, where the console wants it, and what it is doing."""

    def __init__(self, settings: ReplicaSettings, backend: GpuBackend, notify: Notify) -> None:
        self.settings = settings
        self.backend = backend
        self._notify = notify
        self.supervisor = Supervisor(
            self._on_event,
            warm_spares=settings.warm_workers,
            heartbeat_interval=settings.heartbeat_interval,
            heartbeat_timeout=settings.heartbeat_timeout,
            directory=WorkerDirectory(settings.state_dir, settings.orphan_timeout) if settings.state_dir else None,
        )
        self.sleep_budget = settings.sleep_budget if settings.sleep_budget is not None else default_sleep_budget()
        self.backoff = RestartBackoff(settings.restart_backoff_min, settings.restart_backoff_max,
                                      settings.restart_stable_s)
        self.generation = -1  # the desired-state generation applied last
        self._placements: dict[int, DesiredReplica] = {}
        # The GPUs each replica was last placed on: a worker going to sleep (its new placement names no GPU)
        # still holds memory there while it drains, and that memory is ours, never foreign.
        self._on_gpus: dict[int, list[int]] = {}
        self._generations: dict[int, int] = {}  # replica id -> generation its worker was started (or ended) under
        self._gpu_totals: dict[int, int] = {}
        self._restart_timers: dict[int, asyncio.TimerHandle] = {}
        self._restarting: dict[int, WorkerHandle] = {}  # replica id -> the failed worker its timer restarts
        # vLLM sizes its KV cache from the memory free on its GPU as it starts: two starting on one GPU at once
        # mis-size each other (vLLM issue 55827). A vLLM replica whose GPU has another starting waits here.
        self._deferred: dict[str, list[int]] = {}  # device -> replica ids, in the order they asked
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False

    def handles(self) -> list[WorkerHandle]:
        return self.supervisor.handles()

    @property
    def outlive_agent(self) -> bool:
        """Whether replica workers can outlive this agent (it has a state directory for the next one to find them)."""
        return self.supervisor.directory is not None

    async def open(self) -> list[WorkerHandle]:
        """Take the state directory (StateDirError when another agent holds it) and adopt the workers a previous
        agent left there, before the first desired state is applied."""
        directory = self.supervisor.directory
        if directory is None:
            return []
        directory.open()
        adopted = await self.supervisor.adopt_all()
        for handle in adopted:
            log.info("replica %d: adopted its running worker pid %s (%s, %s)", handle.spec.replica_id, handle.pid,
                     handle.state, handle.spec.deployment or handle.spec.model_path)
        # What each adopted pool holds, so the first desired state unloads the adapters no longer wanted.
        await asyncio.gather(*(self._refresh_adapter_stats(h, ADOPTION_TIMEOUT) for h in adopted
                               if h.state == "ready"))
        return adopted

    # --- converging -----------------------------------------------------------------------------

    async def apply(self, desired: DesiredState) -> None:
        """Converge to `desired`: promotions, then what frees memory, then wakes and starts."""
        running = {h.spec.replica_id: self._running(h) for h in self.supervisor.handles()}
        gpus = self.gpus()
        free = {g.index: max(g.total_bytes - g.used_bytes, 0) for g in gpus}
        plan = plan_convergence(desired, running, self.backend.device_kind, free, self.sleep_budget)
        for reason in plan.reasons:
            log.info("generation %d: %s", desired.generation, reason)
        self.generation = desired.generation
        self.place(desired.replicas)
        for handle in self.supervisor.handles():
            self._configure(handle)
        for replica_id in plan.ids("promote"):
            self._handle(replica_id).promote()
        frees = [self._retire(a.replica_id) for a in plan.actions if a.verb == "stop"]
        frees += [self._evict(a.replica_id, a.detail) for a in plan.actions if a.verb == "evict"]
        frees += [self._sleep(self._handle(i)) for i in plan.ids("sleep")]
        for replica_id in plan.ids("demote"):
            self._handle(replica_id).demote()
        await asyncio.gather(*frees)
        for action in plan.actions:
            handle = self.supervisor.get(action.replica_id)
            if action.verb == "wake" and handle is not None:
                self._spawn(self._wake(handle, "preloaded" if action.target == "preloaded" else "ready"))
            elif action.verb == "start" and action.replica is not None and handle is None:
                self._start(action.replica)
                self._generations[action.replica_id] = desired.generation
            elif action.verb == "retarget" and handle is not None:
                handle.after_load = "ready" if action.target == "ready" else "preloaded"
        self._generations = {k: v for k, v in self._generations.items() if self.supervisor.get(k)}
        self.supervisor.settle()  # every change this made is reported before the console hears it applied

    def _configure(self, handle: WorkerHandle) -> None:
        """What a replica's placement says beyond its worker: batching, and the adapters it serves."""
        placement = self._placements.get(handle.spec.replica_id)
        if placement is None:
            return
        handle.batching = BatchSettings(max_batch_size=placement.max_batch_size,
                                        max_delay=placement.max_batch_delay_ms / 1000)
        handle.adapters = {a.name for a in placement.adapters}
        if handle.adapters or handle.adapter_stats:
            self._spawn(self.sync_adapters(handle))

    async def sync_adapters(self, handle: WorkerHandle) -> None:
        """Make the worker's adapter pool hold what the placement lists; sent only when that changed since
        the worker last took it (hints add to the pool's demand scores, so they must not repeat).
        Only while its model is on the device."""
        placement = self._placements.get(handle.spec.replica_id)
        if placement is None or handle.state not in ON_DEVICE or handle.transition is not None:
            return
        gpu_budget = placement.adapter_pool_bytes or DEFAULT_ADAPTER_POOL_BYTES
        config = {
            "gpu_budget": gpu_budget,
            "cpu_budget": placement.adapter_host_bytes or 4 * gpu_budget,
            "load": [a.model_dump() for a in placement.adapters],
            "hints": placement.adapter_hints,
            # The pool's budgets and the reservation they live in grow in place as adapters are added (the
            # scheduler grants the replica more); the worker raises its memory limits by as much.
            "reserved_bytes": placement.reserved_bytes,
        }
        if config == handle.adapter_config:
            return
        wanted = {a.name for a in placement.adapters}
        payload = config | {"unload": sorted({a.name for a in handle.adapter_stats} - wanted)}
        try:
            await handle.configure_adapters(payload)
            handle.adapter_config = config
        except InferenceError as e:
            handle.adapter_error = f"adapters not applied: {e}"
        if handle.adapter_error:
            log.warning("replica %d: %s", handle.spec.replica_id, handle.adapter_error)

    def sleep_room(self) -> int:
        """Host bytes another sleeping replica may take: what the sleep budget has left, at most what the
        host has available."""
        asleep = sum(h.host_bytes for h in self.supervisor.handles() if h.state == "sleeping")
        return max(min(self.sleep_budget - asleep, psutil.virtual_memory().available), 0)

    def refresh_adapters(self) -> None:
        """Ask each idle replica with adapters for its pool's figures (a read, nothing reloaded), so request
        counts and tiers in the next report stay current."""
        for handle in self.supervisor.handles():
            if handle.adapter_config is not None and handle.state == "ready" and not handle.queued:
                self._spawn(self._refresh_adapter_stats(handle))

    async def _refresh_adapter_stats(self, handle: WorkerHandle, timeout: float = DEFAULT_INFER_TIMEOUT) -> None:
        try:
            await handle.refresh_adapter_stats(timeout)
        except InferenceError as e:
            log.info("replica %d: no adapter figures this time: %s", handle.spec.replica_id, e)

    def _running(self, handle: WorkerHandle) -> Running:
        rid = handle.spec.replica_id
        placement = self._placements.get(rid)
        weights = sleep_bytes(handle)
        return Running(
            spec=handle.spec,
            state=handle.state,
            generation=self._generations.get(rid, -1),
            target=placement.state if placement else "ready",
            weights_bytes=weights,
            last_used=handle.last_used,
        )

    def _handle(self, replica_id: int) -> WorkerHandle:
        handle = self.supervisor.get(replica_id)
        assert handle is not None, f"replica {replica_id} has no worker"
        return handle

    def _start(self, replica: DesiredReplica) -> WorkerHandle | None:
        device = device_for(replica, self.backend.device_kind)
        engine = engines.ENGINES.get(replica.engine)
        if engine is not None and engine.starts_one_per_gpu and device != "cpu" and self._one_starting(device):
            waiting = self._deferred.setdefault(device, [])
            if replica.id not in waiting:
                waiting.append(replica.id)
                log.info("replica %d: starts when the %s starting on %s is loaded", replica.id, engine.label, device)
            return None
        try:
            # Read torch-free before spawning: a bad directory fails in milliseconds, with a message
            # that names the file, instead of after a worker has imported torch.
            artifact = engines.inspect(replica.model_path)  # by the engine that reads its format
            if artifact.format == SAFETENSORS and replica.dtype not in DTYPES:  # another's file sets its own types
                raise ArtifactError(f"dtype {replica.dtype!r} is not supported ({', '.join(DTYPES)})")
            running = {name for name, _ in engines.available(self.settings.engine_programs)}
            if engine is None or replica.engine not in running:
                raise ArtifactError(f"this agent runs no {replica.engine} engine (it runs: "
                                    f"{', '.join(sorted(running)) or 'none'})")
            # What the engine cannot run fails here, with the reason, before a process that would read ready and
            # then die at its first request (vLLM's CPU attention and narrow heads) is started at all.
            # From its config alone: this runs on the event loop, so the tokenizer (up to 16 MiB of JSON to parse) is
            # left to the console, which read it when the model was registered and refuses a deployment it rules out.
            refused = engines.refusal(replica.engine, engines.shape(artifact, tokenizer=False), device_kind(device))
            if refused:
                raise ArtifactError(refused)
            spec = self._spec(replica, artifact.task, device, artifact.weights_bytes)
        except ArtifactError as e:
            guess = "causal-lm" if replica.architecture.endswith(CAUSAL_LM_SUFFIXES) else "encoder"
            return self.supervisor.add_failed(self._spec(replica, guess, device, engine_args=False), str(e))
        return self.supervisor.start(spec, after_load="ready" if replica.state == "ready" else "preloaded")

    def _one_starting(self, device: str) -> bool:
        """Whether a replica of an engine that starts one at a time per GPU is starting on `device`."""
        return any(engines.get(h.spec.engine).starts_one_per_gpu and h.spec.device == device
                   and h.state in ("starting", "loading") for h in self.supervisor.handles())

    def _start_deferred(self, device: str) -> None:
        """Start the next replica waiting for `device` once none that starts alone is starting there (if still
        wanted and without a worker)."""
        waiting = self._deferred.get(device, [])
        while waiting and not self._one_starting(device):
            placement = self._placements.get(waiting.pop(0))
            if placement is not None and placement.state != "stopped" and self.supervisor.get(placement.id) is None:
                self._start(placement)

    def _spec(self, replica: DesiredReplica, task: str, device: str, file_bytes: int = 0,
              engine_args: bool = True) -> WorkerSpec:
        gpu = replica.gpus[0] if replica.gpus else 0
        limit = threads = None
        if device == "cpu":
            threads = self.cpu_threads()
            # An engine in processes of its own bounds its own memory (vLLM's KV cache space); an address-space cap
            # would pass to its processes.
            if self.settings.cap_cpu_workers and replica.reserved_bytes and engines.get(replica.engine).in_worker:
                limit = cpu_memory_limit(replica.reserved_bytes, file_bytes, threads)
        engine: dict = {}
        started = None
        if engine_args and replica.engine in engines.ENGINES:
            started = engines.ENGINES[replica.engine].command(replica, device, file_bytes, self._gpu_totals.get(gpu, 0),
                                                              threads)
        if started is not None:
            engine = {"engine_python": self.settings.engine_programs.get(replica.engine, ""),
                      "engine_args": started.args, "engine_env": started.env,
                      "engine_flags": tuple(replica.engine_args)}
        return WorkerSpec(
            replica.id, replica.model_path, task, device, replica.dtype, replica.deployment,
            batch=replica.batch,
            seq=replica.seq,
            reserved_bytes=replica.reserved_bytes,
            gpu_total_bytes=self._gpu_totals.get(gpu, 0),
            mps_percentage=replica.mps_percentage,
            memory_limit_bytes=limit,
            threads=threads,
            engine=replica.engine,
            index=replica.index,
            revision=replica.revision,
            **engine,
        )

    def cpu_threads(self) -> int:
        """Torch threads for a CPU worker started now: the configured count, else this host's share. CUDA
        workers keep torch's default: their CPU side only feeds the GPU."""
        if self.settings.cpu_threads:
            return self.settings.cpu_threads
        placed = sum(1 for r in self._placements.values() if r.state != "stopped")
        return cpu_thread_share(host_cores(), len(self.backend.collect({})), placed)

    # --- sleep, wake, evict ---------------------------------------------------------------------

    async def _drain(self, handle: WorkerHandle) -> None:
        """A replica that leaves (stopped, moved, restarted, put to sleep) takes no new requests and finishes
        those it has first, within the drain timeout."""
        if handle.state == "ready" and not await handle.drained(self.settings.drain_timeout):
            log.warning("replica %d: requests still running after the %g s drain timeout end with it",
                        handle.spec.replica_id, self.settings.drain_timeout)

    async def _retire(self, replica_id: int) -> None:
        handle = self.supervisor.get(replica_id)
        if handle is not None:
            await self._drain(handle)
        await self.supervisor.stop(replica_id)

    async def _sleep(self, handle: WorkerHandle) -> None:
        """Put one replica to sleep within the host-RAM budget, evicting the least recently used."""
        try:
            await self._drain(handle)
            await self._sleep_drained(handle)
        finally:
            handle.draining = False  # asleep (or left ready by a failure), it serves again once ready

    async def _sleep_drained(self, handle: WorkerHandle) -> None:
        rid = handle.spec.replica_id
        weights = sleep_bytes(handle)
        others = [Sleeper(h.spec.replica_id, h.host_bytes, h.last_used)
                  for h in self.supervisor.handles() if h.state == "sleeping" and h is not handle]
        dropped = fit([*others, Sleeper(rid, weights, handle.last_used)], self.sleep_budget)
        await asyncio.gather(*(self._evict(other, why) for other, why in dropped.items() if other != rid))
        if rid in dropped:
            await self._evict(rid, dropped[rid])
            return
        try:
            await handle.sleep(self.settings.swap_timeout)
        except InferenceError as e:
            if handle.state in ON_DEVICE:  # alive but cannot sleep (host memory): stop it to free its GPU
                await self._evict(rid, f"stopped instead of sleeping: {e}")

    async def _wake(self, handle: WorkerHandle, then: str) -> None:
        try:
            await handle.wake("preloaded" if then == "preloaded" else "ready", self.settings.swap_timeout)
        except InferenceError as e:
            log.warning("replica %d: cannot wake: %s", handle.spec.replica_id, e)

    async def _evict(self, replica_id: int, reason: str) -> None:
        log.warning("replica %d: %s", replica_id, reason)
        await self.supervisor.evict(replica_id, reason)
        self._generations[replica_id] = self.generation  # left stopped until the console sends a new generation

    # --- watching -------------------------------------------------------------------------------

    def _on_event(self, handle: WorkerHandle, progress: bool) -> None:
        """The supervisor's word that a replica changed (or, `progress`, only read more of its weights)."""
        if progress:
            self._notify(handle, True)
        else:
            self._on_change(handle)

    def _on_change(self, handle: WorkerHandle) -> None:
        rid = handle.spec.replica_id
        if handle.state == "failed" and handle.pid is not None and not self._stopping:
            self._schedule_restart(handle)  # before it is reported: its reason tells when it restarts
        self._fill_process_bytes(handle)
        self._notify(handle, False)
        engine = engines.get(handle.spec.engine)
        if engine.starts_one_per_gpu and handle.state not in ("starting", "loading"):
            self._start_deferred(handle.spec.device)
        if not engine.in_worker and handle.state in ENDED and handle.info.get("pids"):
            # Its worker is gone: so is all of its engine's processes.
            self._spawn(asyncio.to_thread(engine.kill_leftovers, int(handle.info["pids"][0])))
        if handle.state in LOADED:
            self.backoff.ready(rid, time.monotonic())  # it loaded: the run of failures ends if it stays up
        if handle.state in ON_DEVICE and handle.transition is None:
            self._configure(handle)  # a fresh (or woken) worker gets its batching and adapters
        placement = self._placements.get(rid)
        target = placement.state if placement is not None else None
        if handle.state == "preloaded" and target == "sleeping":
            self._spawn(self._sleep(handle))  # loaded (or restarted) only to be put to sleep
        elif handle.state == "sleeping" and target == "ready" and handle.transition is None and not handle.reason:
            # The console changed its mind while it fell asleep (a failed wake has a reason: no retry loop).
            self._spawn(self._wake(handle, "ready"))

    def _schedule_restart(self, handle: WorkerHandle) -> None:
        """A worker process crashed, hung or failed to load: restart it, backing off so a model that always fails
        costs little, and say so in its reason. (A replica refused before any process started is not retried: its
        directory would be refused again.) The same failure told twice is counted once."""
        rid = handle.spec.replica_id
        if self._restarting.get(rid) is handle:
            return
        delay = self.backoff.failed(rid, time.monotonic())
        failures = self.backoff.failures(rid)
        log.warning("replica %d failed (%s); restarting in %g s (failure %d in a row)", rid, handle.reason, delay,
                    failures)
        handle.reason = f"{handle.reason}; restarts in {delay:g} s (failure {failures} in a row)"
        old = self._restart_timers.pop(rid, None)
        if old is not None:
            old.cancel()
        self._restarting[rid] = handle
        # The coroutine is made when the timer fires: one made now and called off (another failure, a stop)
        # would never be awaited.
        self._restart_timers[rid] = asyncio.get_running_loop().call_later(
            delay, lambda: self._spawn(self._restart(rid, handle))
        )

    def _fill_process_bytes(self, handle: WorkerHandle) -> None:
        # pynvml lives in the daemon (agent/gpus/nvml.py), so NVML's per-process reading, CUDA context
        # included, is added here to what the worker measured.
        m = handle.measurement
        if handle.state not in ON_DEVICE or m is None or m.device != "cuda" or m.process_bytes is not None:
            return
        used = self._process_memory(handle)
        if used:
            handle.measurement = m.model_copy(update={"process_bytes": used, "total_bytes": used})

    def _process_memory(self, handle: WorkerHandle) -> int | None:
        """NVML's reading of what the replica's processes hold on their GPU; None where it has none."""
        readings = [self.backend.process_memory(pid) for pid in handle.device_pids]
        held = [r for r in readings if r is not None]
        return sum(held) if held else None

    async def _restart(self, replica_id: int, failed: WorkerHandle) -> None:
        self._restart_timers.pop(replica_id, None)
        self._restarting.pop(replica_id, None)
        replica = self._placements.get(replica_id)
        # Only the same failed worker of a replica that is still wanted: the desired state may
        # have moved on while we waited.
        if replica is None or replica.state == "stopped" or self.supervisor.get(replica_id) is not failed:
            return
        await self.supervisor.stop(replica_id)
        if self.supervisor.get(replica_id) is None and not self._stopping:
            log.info("replica %d: restarting its worker", replica_id)
            self._start(replica)

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    def place(self, replicas: list[DesiredReplica]) -> None:
        """Take the desired state's placements, remembering the GPUs of each replica that names some."""
        self._placements = {r.id: r for r in replicas}
        for r in replicas:
            if r.gpus:
                self._on_gpus[r.id] = list(r.gpus)
        live = {h.spec.replica_id for h in self.supervisor.handles()} | set(self._placements)
        for gone in set(self._on_gpus) - live:
            del self._on_gpus[gone]

    def gpus(self) -> list[GpuInfo]:
        """The backend's GPU reading, with each simulated GPU charged what its on-device replicas measured."""
        used: dict[int, int] = {}
        for handle in self.supervisor.handles():
            on = self._on_gpus.get(handle.spec.replica_id)
            if handle.measured_bytes and handle.state in ON_DEVICE:
                index = on[0] if on else 0
                used[index] = used.get(index, 0) + handle.measured_bytes
        gpus = self.backend.collect(used)
        own = self._own_bytes(used)
        gpus = [g.model_copy(update={"own_bytes": min(own.get(g.index, 0), g.used_bytes)}) for g in gpus]
        self._gpu_totals = {g.index: g.total_bytes for g in gpus}
        return gpus

    def _own_bytes(self, measured: dict[int, int]) -> dict[int, int]:
        """Device memory this agent's workers hold per GPU, whatever their state (a draining or loading
        worker is ours, never foreign): NVML's per-process reading where there is one, else what the
        on-device workers measured (simulated GPUs charge exactly that)."""
        own: dict[int, int] = {}
        counted = False
        for handle in self.supervisor.handles():
            on = self._on_gpus.get(handle.spec.replica_id)
            held = self._process_memory(handle)
            if held is None or not on:
                continue
            counted = True
            for index in on:  # a gang's memory, split evenly over its GPUs
                own[index] = own.get(index, 0) + held // len(on)
        return own if counted else dict(measured)

    async def stop_all(self) -> None:
        """Stop every worker and spare, each replica drained first (the agent asked to stop: SIGTERM); nothing
        restarts afterwards."""
        await self._quiesce()
        await asyncio.gather(*(self._drain(handle) for handle in self.supervisor.handles()))
        await self.supervisor.stop_all()
        self._close_directory()

    async def detach_all(self) -> None:
        """Leave every replica worker running with its model for the next agent (spares stop); nothing restarts
        afterwards."""
        await self._quiesce()
        await self.supervisor.detach_all()
        self._close_directory()

    async def _quiesce(self) -> None:
        self._stopping = True
        for timer in self._restart_timers.values():
            timer.cancel()
        self._restart_timers.clear()
        self._restarting.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _close_directory(self) -> None:
        if self.supervisor.directory is not None:
            self.supervisor.directory.close()
