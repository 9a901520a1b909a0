"""Simulated agents: many hosts in one asyncio process, speaking the real agent protocol to a real console.

A `SimAgent` is one host with N simulated GPUs. It talks like agent/daemon.py: same websocket path, bearer
token, hello then a report, a report every `report_interval` (what changed, whole now and then: the real
agent's agent.protocol.reports.Reporter), replica state changes carried by reports coalesced as the real agent's
(agent.protocol.outbox.Outbox), an ack naming the generation once a desired state is applied, stale generations
ignored. It converges with the real agent's own diff (agent.converge.plan_convergence). Workers are not
processes: a start goes starting -> loading -> ready after modelled times, sleeps and wakes take modelled times,
and a load can be made to fail.
`SimFleet` runs many of them with bounded connect concurrency and the real agent's reconnect backoff, and
keeps per-agent metrics for benchmarks (bench/fleet.py) and tests.

No Django and no pytest here: tests import this as `bench.fleet_sim`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from pydantic import BaseModel, ValidationError

from agent.converge import Running, device_for, plan_convergence
from agent.protocol import (
    LIVE_STATES,
    LOADED,
    PROTOCOL_VERSION,
    Ack,
    DeploymentServing,
    DesiredReplica,
    DesiredState,
    ErrorReply,
    GpuInfo,
    Hello,
    HostReport,
    LogsReply,
    LogsRequest,
    Measurement,
    ReplicaStatus,
    SleepWake,
    dump,
    parse_console_message,
)
from agent.protocol.outbox import Outbox
from agent.protocol.reports import Reporter
from agent.restarts import BACKOFF_MIN_S
from agent.workers.spec import WorkerSpec

GIB = 1 << 30
WS_PATH = "/ws/agent/"  # agent.daemon.WS_PATH (not imported: the daemon pulls in the inference server)
SIM_VERSION = "sim-1"
LAG_PROBE_S = 0.01
_pids = itertools.count(100_000)  # fake worker pids: each start a new one, as a real worker process would be


@dataclass(frozen=True)
class SimSpec:
    """How every simulated host looks and behaves. Times are seconds; each is jittered by +-`jitter`."""

    gpus: int = 8
    gpu_bytes: int = 80 * GIB
    report_interval: float = 2.0
    start_s: float = 0.1  # worker process up: starting -> loading
    load_s: float = 1.0  # weights read and warmed up: loading -> ready
    sleep_s: float = 0.1  # ready -> sleeping
    wake_s: float = 0.2  # sleeping -> ready
    jitter: float = 0.2  # fraction
    fail_rate: float = 0.0  # chance that a load fails (failure injection)
    backoff_min: float = 0.5  # reconnect backoff, as the real agent's AgentConfig
    backoff_max: float = 10.0
    handshake_timeout: float = 15.0
    seed: int = 0
    # Busy GPUs: every reading moves (utilisation, memory), and so do the hosts' serving figures, so every report
    # is whole, as real agents under traffic send them.
    busy: bool = False


@dataclass
class SimReplica:
    desired: DesiredReplica
    state: str  # starting, loading, ready, preloaded, sleeping, failed
    target: str  # where it heads once loaded or woken: ready, preloaded or sleeping
    generation: int  # the generation it was started (or last failed) under, as agent.converge reads it
    pid: int = field(default_factory=lambda: next(_pids))
    reason: str = ""
    task: asyncio.Task | None = None
    said: tuple | None = None  # (what its last status was built from, that status): see SimAgent._status
    _spec: tuple[DesiredReplica, WorkerSpec] | None = None

    def spec(self) -> WorkerSpec:
        """Its worker's spec as agent.converge compares it, built again only for a new desired replica."""
        if self._spec is None or self._spec[0] is not self.desired:
            self._spec = self.desired, _spec(self.desired)
        return self._spec[1]

    @property
    def measured_bytes(self) -> int | None:
        # A simulated worker measures exactly what the console reserved (0 for a sleeping placement).
        return (self.desired.reserved_bytes or GIB) if self.state in LOADED else None


@dataclass
class AgentMetrics:
    """What one simulated agent saw. Times are time.monotonic() of this process."""

    connects: int = 0
    link_losses: int = 0  # connections that ended while the agent was not being stopped
    loss_reasons: collections.Counter[str] = field(default_factory=collections.Counter)  # why they ended
    refused: int = 0  # handshakes the console refused (bad token, HTTP error)
    errors: list[str] = field(default_factory=list)  # the console's error replies
    acks: list[tuple[int, float, float]] = field(default_factory=list)  # (generation, received, ack queued)
    ready_at: dict[int, float] = field(default_factory=dict)  # replica id -> when it last became ready
    deployment_of: dict[int, str] = field(default_factory=dict)  # replica id -> deployment name
    taken_away: int = 0  # ready replicas the console stopped here (moved elsewhere, scaled down, deleted)
    connected_since: float | None = None  # None while not connected
    offline: list[tuple[float, float]] = field(default_factory=list)  # (from, to) without a link, after the first

    @property
    def reconnects(self) -> int:
        return max(self.connects - 1, 0)


class SimAgent:
    """One simulated host; `run()` keeps it connected until cancelled."""

    def __init__(self, console: str, name: str, token: str, spec: SimSpec = SimSpec()) -> None:
        self.console = console.rstrip("/")
        self.name = name
        self.token = token
        self.spec = spec
        self.replicas: dict[int, SimReplica] = {}
        self.applied_generation: int | None = None
        self.metrics = AgentMetrics()
        self._rng = random.Random(spec.seed * 1_000_003 + zlib.crc32(name.encode()))
        self._outbox: Outbox | None = None
        self._reporter = Reporter()  # what this link was last told: reports carry what changed since
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._muted_until = 0.0
        self._lost_at: float | None = None
        self._why = ""  # why the last connection attempt or link ended
        self._generation = -1  # of the last desired state applied, across connections (as agent.replicas)
        self._gpus: list[GpuInfo | None] = []  # the last reading of each GPU (see gpus())
        self._moves = 0  # counts what changes a GPU's use: a replica started, stopped, moved on, or given anew
        self._read_at: tuple[int, SimSpec] | None = None  # (_moves, spec) the readings were last taken at

    @property
    def url(self) -> str:
        base = self.console.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        return base + WS_PATH

    @property
    def connected(self) -> bool:
        return self.metrics.connected_since is not None

    # -- chaos ---------------------------------------------------------------------------------------------

    def drop_link(self) -> None:
        """Close the websocket now (a network blip); the agent reconnects with backoff."""
        if self._ws is not None:
            asyncio.get_running_loop().create_task(self._ws.close())

    def mute(self, seconds: float) -> None:
        """Send nothing for `seconds` while staying connected (a hung agent): its lease should lapse."""
        self._muted_until = time.monotonic() + seconds

    def crash(self, replica_id: int, reason: str = "simulated worker crash") -> None:
        """A replica's worker dies: it reports failed and, as the real agent does (agent/replicas.py), is
        started again as a new process after the first restart delay (a load that fails stays failed)."""
        replica = self.replicas.get(replica_id)
        if replica is not None:
            self._cancel(replica)
            self._become(replica, "failed", reason)
            replica.task = asyncio.get_running_loop().create_task(self._restart(replica))

    async def _restart(self, replica: SimReplica) -> None:
        await asyncio.sleep(BACKOFF_MIN_S)
        if self.replicas.get(replica.desired.id) is replica:  # not stopped or replaced meanwhile
            self._start(replica.desired, replica.generation)

    # -- the link ------------------------------------------------------------------------------------------

    async def run(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore | None = None) -> None:
        """Stay connected, reconnecting with doubling backoff like the real agent, until cancelled. `gate` bounds
        how many agents of this process dial at once (held for the handshake and the hello only)."""
        delay = self.spec.backoff_min
        headers = {"Authorization": f"Bearer {self.token}"}
        while True:
            try:
                async with gate if gate is not None else contextlib.nullcontext():
                    self._ws = await session.ws_connect(self.url, headers=headers, heartbeat=30,
                                                        timeout=aiohttp.ClientWSTimeout(ws_close=5))
                    self._link_up()
                    await self._greet()
                await self._converse(self._ws)
                delay = self.spec.backoff_min
            except aiohttp.WSServerHandshakeError as e:
                self.metrics.refused += 1
                self._why = f"handshake refused (HTTP {e.status})"
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                self._why = type(e).__name__
            finally:
                await self._link_down()
            await asyncio.sleep(delay * (1 + self._rng.uniform(-0.1, 0.1)))
            delay = min(delay * 2, self.spec.backoff_max)

    def _link_up(self) -> None:
        now = time.monotonic()
        if self._lost_at is not None:
            self.metrics.offline.append((self._lost_at, now))
        self.metrics.connects += 1
        self.metrics.connected_since = now
        # Staleness is judged within one connection, as the real agent does.
        self.applied_generation = None
        self._outbox = Outbox(self._report)

    async def _link_down(self) -> None:
        ws, self._ws, self._outbox = self._ws, None, None
        why, self._why = self._why, ""
        if ws is not None and not why:
            error = ws.exception()
            why = f"closed, code {ws.close_code}" + (f" ({type(error).__name__})" if error else "")
        if ws is not None and not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()
        if self.metrics.connected_since is not None:  # None when SimFleet.stop() is ending it on purpose
            self.metrics.link_losses += 1
            self.metrics.loss_reasons[why or "closed"] += 1
            self._lost_at = time.monotonic()
        self.metrics.connected_since = None

    async def _greet(self) -> None:
        self._reporter.reset()
        await self._ws.send_str(dump(self._hello()))
        await self._ws.send_str(dump(self._report()))

    async def _converse(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        assert self._outbox is not None
        tasks = [asyncio.create_task(self._send_loop(ws)), asyncio.create_task(self._report_loop())]
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    if self._on_console_message(message.data):
                        # The ack leaves now, from the task that applied the desired state, not from the send loop.
                        # An agent on its own machine sends it at once; here a thousand agents share one loop, and
                        # the send loop of each agent a wave reached ran only after every other agent read in the
                        # same turn of the loop had applied its state: acks waited 80-260 ms for other hosts'
                        # applies (a throwaway trace, docs/benchmarks.md). The report the apply asked for follows
                        # from the send loop, so the console still hears the ack, then the report.
                        await self._send_next(ws)
                elif message.type == aiohttp.WSMsgType.ERROR:
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send_next(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Send the outbox's next message (acks go first, agent.protocol.outbox). No await comes between taking a
        message and writing its frame (aiohttp writes a frame whole before it waits to drain), so this and the send
        loop keep the outbox's order on the wire."""
        text = await self._outbox.get()
        try:
            if time.monotonic() >= self._muted_until:  # a hung agent says nothing
                await ws.send_str(text)
        finally:
            self._outbox.task_done()

    async def _send_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            while True:
                await self._send_next(ws)

    async def _report_loop(self) -> None:
        # Hosts start their timers at different moments, as real ones do; no thundering herd on the console.
        await asyncio.sleep(self._rng.uniform(0, self.spec.report_interval))
        while True:
            if self._outbox is not None:
                self._outbox.report()
            await asyncio.sleep(self.spec.report_interval)

    def _post(self, message: BaseModel) -> None:
        if self._outbox is not None:  # dropped while disconnected: the report on reconnect has everything
            self._outbox.post(message)

    def _on_console_message(self, text: str) -> bool:
        """Act on one console message; True when that posted an ack (a desired state applied)."""
        try:
            message = parse_console_message(text)
        except ValidationError as e:
            self.metrics.errors.append(f"invalid console message: {e.errors()[0]['msg']}")
            return False
        if isinstance(message, ErrorReply):
            self.metrics.errors.append(message.reason)
            return False
        if isinstance(message, LogsRequest):
            self._post(LogsReply(request_id=message.request_id, replica_id=message.replica_id,
                                 error=f"{self.name} is a simulated host (bench/fleet_sim.py): its replicas have no "
                                 "worker processes, so no logs"))
            return False
        received = time.monotonic()
        if self.applied_generation is not None and message.generation < self.applied_generation:
            return False  # stale
        self.apply(message)
        self.applied_generation = message.generation
        self.metrics.acks.append((message.generation, received, time.monotonic()))
        self._post(Ack(generation=message.generation))
        return True

    # -- converging ----------------------------------------------------------------------------------------

    def apply(self, desired: DesiredState) -> None:
        """Converge to `desired` with the real agent's diff; the changes it starts are reported at once."""
        running = {rid: Running(spec=r.spec(), state=r.state, generation=r.generation, target=r.target,
                                weights_bytes=r.measured_bytes or 0) for rid, r in self.replicas.items()}
        free = {g.index: g.total_bytes - g.used_bytes for g in self.gpus()}
        plan = plan_convergence(desired, running, "cpu", free)
        self._generation = desired.generation
        wanted = {r.id: r for r in desired.replicas}
        for rid, replica in self.replicas.items():
            # Kept when equal: its worker spec (and status) stay built (SimReplica.spec), where every push of a
            # host's ten replicas built ten specs again.
            if rid in wanted and wanted[rid] != replica.desired:
                replica.desired = wanted[rid]
        self._moves += 1
        for action in plan.actions:
            replica = self.replicas.get(action.replica_id)
            if action.verb in ("stop", "evict") and replica is not None:
                self._stop(replica, action.replica_id not in wanted or wanted[action.replica_id].state == "stopped")
            elif action.verb == "start" and action.replica is not None:
                self._start(action.replica, desired.generation)
            elif action.verb in ("promote", "demote") and replica is not None:
                replica.target = action.target
                self._become(replica, action.target)
            elif action.verb == "sleep" and replica is not None:
                self._transition(replica, "sleeping", self.spec.sleep_s)
            elif action.verb == "wake" and replica is not None:
                self._transition(replica, action.target, self.spec.wake_s)
            elif action.verb == "retarget" and replica is not None:
                replica.target = action.target

    def _start(self, desired: DesiredReplica, generation: int) -> None:
        replica = SimReplica(desired=desired, state="starting", target=desired.state, generation=generation)
        self.replicas[desired.id] = replica
        self._moves += 1
        self.metrics.deployment_of[desired.id] = desired.deployment
        self._changed(self._status(replica))
        replica.task = asyncio.get_running_loop().create_task(self._load(replica))

    async def _load(self, replica: SimReplica) -> None:
        await asyncio.sleep(self._time(self.spec.start_s))
        self._become(replica, "loading")
        await asyncio.sleep(self._time(self.spec.load_s))
        if self._rng.random() < self.spec.fail_rate:
            self._become(replica, "failed", "simulated load failure")
            return
        self._become(replica, "ready" if replica.target == "ready" else "preloaded")
        if replica.target == "sleeping":
            await asyncio.sleep(self._time(self.spec.sleep_s))
            self._become(replica, "sleeping")

    def _transition(self, replica: SimReplica, state: str, seconds: float) -> None:
        self._cancel(replica)
        replica.target = state

        async def move() -> None:
            await asyncio.sleep(self._time(seconds))
            self._become(replica, state)

        replica.task = asyncio.get_running_loop().create_task(move())

    def _stop(self, replica: SimReplica, leaving: bool) -> None:
        self._cancel(replica)
        if leaving and replica.state == "ready":
            self.metrics.taken_away += 1
        rid = replica.desired.id
        del self.replicas[rid]
        self._moves += 1
        self.metrics.ready_at.pop(rid, None)
        self._changed(ReplicaStatus(replica_id=rid, state="stopped"))

    def _cancel(self, replica: SimReplica) -> None:
        if replica.task is not None and not replica.task.done():
            replica.task.cancel()
        replica.task = None

    def _become(self, replica: SimReplica, state: str, reason: str = "") -> None:
        if replica.state == state and replica.reason == reason:
            return
        replica.state, replica.reason = state, reason
        self._moves += 1
        if state == "ready":
            self.metrics.ready_at[replica.desired.id] = time.monotonic()
        if state == "failed":  # left failed until the console sends another generation (agent.converge)
            replica.generation = self._generation
        self._changed(self._status(replica))

    def _changed(self, status: ReplicaStatus) -> None:
        if self._outbox is not None:  # dropped while disconnected: the report on reconnect has everything
            self._outbox.changed(status)

    def _time(self, seconds: float) -> float:
        return max(seconds * (1 + self._rng.uniform(-self.spec.jitter, self.spec.jitter)), 0.0)

    # -- what it reports -----------------------------------------------------------------------------------

    # The readings and statuses are built again only when what they say changed: a thousand agents share this
    # process's one loop, and building them anew for every push and report (pydantic models, eight GPUs a
    # host) was most of the 0.2-0.5 s of CPU a wave of 1,000 pushes cost here, each agent's answer waiting for it.

    def gpus(self) -> list[GpuInfo]:
        # Read again only after something moved: most calls are a quiet host's periodic report.
        if self._read_at is not None and self._read_at[0] == self._moves and self._read_at[1] is self.spec:
            return list(self._gpus)  # type: ignore[arg-type]
        self._read_at = self._moves, self.spec
        used = [0] * self.spec.gpus
        for r in self.replicas.values():
            if r.state in ("starting", "loading", "ready", "preloaded"):
                for index in r.desired.gpus:
                    if index < len(used):
                        used[index] += r.desired.reserved_bytes
        if len(self._gpus) != len(used):  # a new spec (tests give hosts of one fleet different GPU counts)
            self._gpus = [None] * len(used)
        for i, u in enumerate(used):
            u = min(u, self.spec.gpu_bytes)
            gpu = self._gpus[i]
            if gpu is None or gpu.used_bytes != u:
                self._gpus[i] = GpuInfo(index=i, uuid=f"SIM-{self.name}-{i}", name="Simulated GPU",
                                        total_bytes=self.spec.gpu_bytes, used_bytes=u, own_bytes=u, utilization=0.0,
                                        simulated=True)
        return list(self._gpus)  # type: ignore[arg-type]  (every one is set now)

    def _status(self, replica: SimReplica) -> ReplicaStatus:
        key = (replica.state, replica.reason, replica.pid, replica.measured_bytes, replica.desired.batch,
               replica.desired.seq)
        if replica.said is None or replica.said[0] != key:
            replica.said = key, self._build_status(replica)
        return replica.said[1]

    def _build_status(self, replica: SimReplica) -> ReplicaStatus:
        measured = replica.measured_bytes
        measurement = None if measured is None else Measurement(
            device="cpu", batch=replica.desired.batch, seq=replica.desired.seq or 256, weights_bytes=measured,
            peak_bytes=measured, total_bytes=measured, load_seconds=self.spec.load_s)
        sleeping = replica.state == "sleeping"
        return ReplicaStatus(
            replica_id=replica.desired.id, state=replica.state, reason=replica.reason,
            pid=replica.pid if replica.state in LIVE_STATES else None,
            measured_bytes=measured, measurement=measurement, host_bytes=measured if sleeping else None,
            sleep_wake=SleepWake(direction="sleep", bytes=measured, seconds=self.spec.sleep_s)
            if sleeping and measured else None,
        )

    def _hello(self) -> Hello:
        return Hello(protocol=PROTOCOL_VERSION, host=self.name, agent_version=SIM_VERSION,
                     endpoint=f"http://{self.name}.sim.invalid:9000", gpus=self.gpus())

    def _report(self, gone: list[ReplicaStatus] = ()) -> HostReport:
        statuses = [self._status(r) for r in self.replicas.values()]
        if self.spec.busy:
            return self._reporter.report(self._busy_gpus(), statuses, self._serving(), 64 * GIB, full=True,
                                         gone=gone)
        return self._reporter.report(self.gpus(), statuses, [], 64 * GIB, gone=gone)

    def _busy_gpus(self) -> list[GpuInfo]:
        """This moment's readings of busy GPUs: what the replicas hold and some KV cache, at some utilisation."""
        readings = []
        for gpu in self.gpus():
            used = gpu.used_bytes + (self._rng.randrange(1, 64) << 20 if gpu.used_bytes else 0)
            readings.append(gpu.model_copy(update={"used_bytes": min(used, gpu.total_bytes), "own_bytes":
                                                   min(used, gpu.total_bytes),
                                                   "utilization": round(self._rng.uniform(20, 95), 1)}))
        return readings

    def _serving(self) -> list[DeploymentServing]:
        deployments = sorted({r.desired.deployment for r in self.replicas.values() if r.state == "ready"})
        rng = self._rng
        return [DeploymentServing(deployment=d, requests=rng.randrange(50, 500),
                                  request_rate=round(rng.uniform(1, 8), 2), error_rate=0.0,
                                  p50_ms=round(rng.uniform(20, 60), 1), p95_ms=round(rng.uniform(60, 200), 1))
                for d in deployments]


def _spec(desired: DesiredReplica) -> WorkerSpec:
    # Only what agent.converge compares (model, dtype, deployment, device) matters for the diff.
    return WorkerSpec(replica_id=desired.id, model_path=desired.model_path, task="causal-lm",
                      device=device_for(desired, "cpu"), dtype=desired.dtype, deployment=desired.deployment)


class SimFleet:
    """N simulated agents in this process. Use `async with SimFleet(...) as fleet:`; it stops them on exit."""

    def __init__(self, console: str, tokens: dict[str, str], spec: SimSpec = SimSpec(),
                 connect_concurrency: int = 50) -> None:
        if connect_concurrency < 1:
            raise ValueError(f"connect_concurrency must be at least 1, got {connect_concurrency}")
        self.agents = {name: SimAgent(console, name, token, spec) for name, token in tokens.items()}
        self.spec = spec
        self._gate = asyncio.Semaphore(connect_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        # (when, seconds late): how far behind this process's event loop ran, sampled every LAG_PROBE_S. Every agent
        # shares the loop, so a wave's pushes are handled one after another here, where real agents answer at once.
        self.loop_lag: list[tuple[float, float]] = []

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        # No connection limit: every agent holds one websocket for as long as it runs. The read timeout bounds the
        # handshake; aiohttp lifts it once the websocket is open (as the real agent's session).
        bound = self.spec.handshake_timeout
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                              timeout=aiohttp.ClientTimeout(total=None, connect=bound, sock_read=bound))
        self._tasks = [asyncio.create_task(a.run(self._session, self._gate), name=f"sim-{a.name}")
                       for a in self.agents.values()]
        self._tasks.append(asyncio.create_task(self._probe_lag(), name="sim-loop-lag"))

    async def _probe_lag(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(LAG_PROBE_S)
            now = time.monotonic()
            self.loop_lag.append((now, now - asked - LAG_PROBE_S))

    async def stop(self) -> None:
        for agent in self.agents.values():
            agent.metrics.connected_since = None  # a stop is no link loss
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def refresh(self) -> None:
        """Nothing to fetch: the agents are in this process (bench/fleet_procs.ProcessFleet fetches its children's)."""

    async def collect(self) -> None:
        """As refresh()."""

    def processes(self) -> list:
        """Other processes running agents: none."""
        return []

    def connected(self) -> int:
        return sum(a.connected for a in self.agents.values())

    def ready(self) -> dict[int, float]:
        """Replica id -> when it became ready, over replicas ready now on any host."""
        return {rid: t for a in self.agents.values() for rid, r in a.replicas.items()
                if r.state == "ready" and (t := a.metrics.ready_at.get(rid)) is not None}

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for a in self.agents.values():
            for r in a.replicas.values():
                counts[r.state] = counts.get(r.state, 0) + 1
        return counts

    async def wait_for(self, predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
        """Poll `predicate` (on this loop, after a refresh) until truthy; False after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await self.refresh()
            if predicate():
                return True
            await asyncio.sleep(interval)
        await self.refresh()
        return bool(predicate())
