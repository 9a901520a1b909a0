"""The agent daemon: serves inference, keeps a websocket to the console, and converges workers to
the desired state the console sends.

Message flow on each connection: agent sends hello, then a report; then a report every
`report_interval` seconds and a replica_status on every worker state change (and, throttled, on
loading progress); the console sends desired_state (answered by an ack once applied), logs_request (answered
by logs: the tail of a replica's worker log, agent.workers.logs) or error.
The replicas themselves (converging, restarts, sleep budget, wakes) are agent.replicas. Each desired
state that is not stale also carries the gateway secret, the one bearer token the inference server accepts
(agent.serving.auth); it is kept in memory only, across reconnects, and replaced by each newer one.

With a state directory, replica workers outlive the agent: on start it adopts the workers a previous agent left
there (before it first converges), and on stop it leaves them running with their models unless
`stop_workers_on_exit` (agent.workers.rendezvous).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field, fields

import aiohttp
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError

import agent
from agent import engines
from agent.gpus import GpuBackend
from agent.metrics import Metrics, replica_snapshot
from agent.mps import MpsControl
from agent.protocol import (
    PROTOCOL_VERSION,
    Ack,
    DeploymentServing,
    DesiredState,
    EngineInfo,
    ErrorReply,
    GpuInfo,
    Hello,
    HostReport,
    LogsReply,
    LogsRequest,
    ReplicaStatus,
    parse_console_message,
)
from agent.protocol.outbox import Outbox
from agent.protocol.reports import Reporter
from agent.replicas import DEFAULT_DRAIN_TIMEOUT, Replicas, ReplicaSettings
from agent.restarts import RestartBackoff
from agent.serving import make_app, start_server
from agent.serving.auth import GatewayAuth, PickerAccess
from agent.serving.textpool import DEFAULT_TEXT_TIMEOUT, DEFAULT_TEXT_WORKERS, TextPool
from agent.workers.generation_spec import DEFAULT_GENERATION_TIMEOUT
from agent.workers.heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from agent.workers.rendezvous import DEFAULT_ORPHAN_TIMEOUT
from agent.workers.supervisor import DEFAULT_WARM_SPARES, Supervisor, WorkerHandle

log = logging.getLogger(__name__)

WS_PATH = "/ws/agent/"
_FLUSH_ON_EXIT_S = 1.0


@dataclass(frozen=True)
class AgentConfig:
    console: str  # http(s):// or ws(s):// base URL of the console
    token: str
    name: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    report_interval: float = 2.0
    advertise: str = ""  # inference base URL to announce; default from the listen address
    backoff_min: float = 0.5
    backoff_max: float = 10.0
    restart_backoff_min: float = 1.0  # a crashed worker is restarted after this, doubling per crash
    restart_backoff_max: float = 60.0
    warm_workers: int = DEFAULT_WARM_SPARES  # spawned workers kept with torch imported, for fast starts
    sleep_budget: int | None = None  # host bytes for sleeping replicas; None: half the host's RAM
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT  # a loaded worker silent this long is killed and replaced
    mps: bool = False  # start the CUDA MPS control daemon (real GPUs only)
    cap_cpu_workers: bool = True  # hold CPU workers to their reservation (address-space cap)
    cpu_threads: int | None = None  # torch threads per CPU worker; None: the host's cores shared among them
    generation_timeout: float = DEFAULT_GENERATION_TIMEOUT  # seconds a generation may run unless it says otherwise
    text_timeout: float = DEFAULT_TEXT_TIMEOUT  # seconds one request's tokenizing or chat templating may take
    text_workers: int = DEFAULT_TEXT_WORKERS  # processes that tokenize and render chat templates
    state_dir: str | None = None  # replica workers outlive the agent there; None: they die with it (as before)
    stop_workers_on_exit: bool = False  # with a state_dir: stop the workers on stop instead of leaving them
    orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT  # seconds a worker left without an agent waits before it exits
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # a leaving replica finishes its requests within this, then goes
    # What each engine that runs a program of its own runs here (an interpreter, a binary), by engine name: this
    # agent runs those engines (agent.engines: Engine.program).
    engine_programs: dict[str, str] = field(default_factory=dict)
    # An endpoint picker of the operator's own (agent.serving.auth.PickerAccess): its token, and whether its
    # metrics pages answer without one.
    picker_token: str = field(default="", repr=False)
    picker_open_metrics: bool = False

    def replica_settings(self) -> ReplicaSettings:
        """The fields of this config that are the replicas' (same names, same meaning)."""
        shared = [f.name for f in fields(ReplicaSettings) if hasattr(self, f.name)]
        return ReplicaSettings(**{name: getattr(self, name) for name in shared})


def websocket_url(console: str) -> str:
    """The agent link URL for a console base URL (http -> ws, https -> wss)."""
    base = console.rstrip("/")
    for old, new in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(old):
            base = new + base[len(old) :]
    if not base.startswith(("ws://", "wss://")):
        raise ValueError(f"console URL {console!r} must start with http://, https://, ws:// or wss://")
    return base + WS_PATH


class Agent:
    """One host's agent; `run()` until `request_stop()`, then every worker is stopped, or left running for the next
    agent (a state directory and not `stop_workers_on_exit`)."""

    def __init__(self, config: AgentConfig, backend: GpuBackend) -> None:
        self.config = config
        self.backend = backend
        self.ws_url = websocket_url(config.console)
        self.replicas = Replicas(config.replica_settings(), backend, self._on_worker_change)
        self.endpoint = ""
        self.gateway = GatewayAuth()  # the inference server's one accepted secret, from the desired states
        self.listening = asyncio.Event()
        self.applied_generation: int | None = None
        self._desired: DesiredState | None = None  # the newest desired state not yet being applied
        self._desired_came = asyncio.Event()
        self._applier: asyncio.Task | None = None  # applies them, one at a time (_apply_loop)
        self._outbox: Outbox | None = None
        self._reporter = Reporter()  # what the console was last told: reports carry what changed since
        self._stop = asyncio.Event()
        self._mps: MpsControl | None = None
        self.metrics = Metrics(CollectorRegistry())  # its own registry: /metrics shows this agent only

    @property
    def supervisor(self) -> Supervisor:
        return self.replicas.supervisor

    @property
    def backoff(self) -> RestartBackoff:
        return self.replicas.backoff

    def handles(self) -> list[WorkerHandle]:
        """The replicas the inference server answers for."""
        return self.replicas.handles()

    def request_stop(self) -> None:
        """Ask `run()` to stop the workers and return (safe from a signal handler on the loop)."""
        self._stop.set()

    @property
    def leaves_workers(self) -> bool:
        """Whether stopping leaves the replica workers running for the next agent."""
        return self.replicas.outlive_agent and not self.config.stop_workers_on_exit

    async def run(self) -> None:
        """Serve inference and stay connected to the console until asked to stop."""
        adopted = await self.replicas.open()  # StateDirError when another agent runs on this state directory
        # Which engines run here, read once (a vLLM interpreter is asked for its version), before the hello.
        await asyncio.to_thread(engines.available, self.config.engine_programs)
        try:
            await self._start_mps()
            try:
                app = make_app(self, metrics=self.metrics, auth=self.gateway,
                               generation_timeout=self.config.generation_timeout,
                               text=TextPool(self.config.text_workers, self.config.text_timeout),
                               picker=PickerAccess(self.config.picker_token, self.config.picker_open_metrics))
                runner, port = await start_server(app, self.config.listen_host, self.config.listen_port)
            except BaseException:
                await self._stop_mps()
                raise
        except BaseException:
            await self._let_go()
            raise
        self.endpoint = self.config.advertise.rstrip("/") or _endpoint(self.config.listen_host, port)
        print(f"ModelGrid agent {self.config.name} serving inference on {self.endpoint}", flush=True)
        if adopted:
            log.info("adopted %d running worker(s) from the previous agent", len(adopted))
        self.listening.set()
        try:
            self.supervisor.start_spares()
            # Bounded handshake; aiohttp lifts the read timeout once the websocket is open.
            timeout = aiohttp.ClientTimeout(total=None, connect=15, sock_read=30)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                link = asyncio.create_task(self._stay_connected(session))
                await self._stop.wait()
                log.info("stopping: %d worker(s)%s", len(self.supervisor.handles()),
                         " left running for the next agent" if self.leaves_workers else "")
                if self._applier is not None:  # converging no more: what it started is stopped or left below
                    self._applier.cancel()
                    await asyncio.gather(self._applier, return_exceptions=True)
                await self._let_go()
                await self._flush()  # let the console hear the replicas stopped
                link.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await link
        finally:
            await self._let_go()
            if not self.leaves_workers:
                await self._stop_mps()  # after the workers: MPS clients must be gone before the server quits
            await runner.cleanup()

    async def _let_go(self) -> None:
        """Stop the workers, or leave them to the next agent (a crash on the way out leaves them too)."""
        if self.leaves_workers:
            await self.replicas.detach_all()
        else:
            await self.replicas.stop_all()

    async def _start_mps(self) -> None:
        if not self.config.mps:
            return
        if self.backend.device_kind != "cuda":
            log.info("--mps with simulated GPUs: each replica's MPS share is recorded in its status; "
                     "no MPS daemon is started")
            return
        self._mps = MpsControl()
        await self._mps.start()  # MpsUnavailable says what is missing

    async def _stop_mps(self) -> None:
        if self._mps is not None:
            await self._mps.stop()

    async def _stay_connected(self, session: aiohttp.ClientSession) -> None:
        delay = self.config.backoff_min
        headers = {"Authorization": f"Bearer {self.config.token}"}
        while True:
            try:
                async with session.ws_connect(self.ws_url, headers=headers, heartbeat=30) as ws:
                    log.info("connected to the console at %s", self.ws_url)
                    delay = self.config.backoff_min
                    await self._converse(ws)
                    log.warning("the console closed the connection (code %s)", ws.close_code)
            except aiohttp.WSServerHandshakeError as e:
                if e.status in (401, 403):
                    log.error(
                        "console refused the agent token (HTTP %d) for host %r: check --token or MODELGRID_AGENT_TOKEN",
                        e.status,
                        self.config.name,
                    )
                else:
                    log.warning(
                        "console refused the websocket handshake at %s (HTTP %d %s)", self.ws_url, e.status, e.message
                    )
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                log.warning("cannot reach the console at %s: %s", self.ws_url, e or type(e).__name__)
            log.info("reconnecting in %.1f s", delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.backoff_max)

    async def _converse(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        outbox = Outbox(self._report)
        self._outbox = outbox
        # A new connection may face a console restored from a backup, whose generations restart:
        # staleness is judged within one connection (messages cannot cross connections).
        self.applied_generation = None
        self._desired = None  # one the last link sent and the applier has not begun: this link sends its own
        self._reporter.reset()
        self._post(self._hello())
        outbox.report()  # whole: the first on a link
        tasks = [asyncio.create_task(self._send_loop(ws, outbox)), asyncio.create_task(self._report_loop())]
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await self._on_console_message(message.data)
                elif message.type == aiohttp.WSMsgType.ERROR:
                    log.warning("websocket error: %s", ws.exception())
                    break
        finally:
            self._outbox = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send_loop(self, ws: aiohttp.ClientWebSocketResponse, outbox: Outbox) -> None:
        # One writer per connection keeps messages in order (hello first, statuses as they happened).
        try:
            while True:
                text = await outbox.get()
                await ws.send_str(text)
                outbox.task_done()
        except (aiohttp.ClientError, ConnectionError) as e:
            log.warning("cannot send to the console: %s", e)
            await ws.close()
        except Exception:  # a report that cannot be built: a new link starts over with a whole one
            log.exception("cannot send to the console")
            await ws.close()

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.report_interval)
            if self._outbox is not None:
                self._outbox.report()
            self.replicas.refresh_adapters()  # their counts reach the console with the next report

    async def _flush(self) -> None:
        if self._outbox is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._outbox.join(), _FLUSH_ON_EXIT_S)

    def _post(self, message: BaseModel) -> None:
        # Dropped while disconnected: the report sent on reconnect carries every replica's state.
        if self._outbox is not None:
            self._outbox.post(message)

    async def _on_console_message(self, text: str) -> None:
        try:
            message = parse_console_message(text)
        except ValidationError as e:
            log.warning("ignoring a console message that does not validate: %s", _first_error(e))
            return
        if isinstance(message, ErrorReply):
            log.error("the console reports an error: %s", message.reason)
        elif isinstance(message, DesiredState):
            # Applied by a task of its own, the newest first: a drain (up to --drain-timeout) or a sleep must not hold
            # the link's reading, which answers the console's keepalive pings and its log requests.
            self._desired = message
            self._desired_came.set()
            if self._applier is None or self._applier.done():
                self._applier = asyncio.create_task(self._apply_loop(), name="agent-apply")
        elif isinstance(message, LogsRequest):
            self._post(await self.logs(message))

    async def _apply_loop(self) -> None:
        """Apply the newest desired state the console sent, one at a time; acknowledge each applied. One that came
        while another was applied replaces any still waiting (each is whole)."""
        while True:
            await self._desired_came.wait()
            self._desired_came.clear()
            desired, self._desired = self._desired, None
            if desired is None:
                continue
            try:
                applied = await self.apply(desired)
            except Exception:  # a bug here must not end converging; the console resends on reconnect
                log.exception("cannot apply desired state generation %d", desired.generation)
                continue
            if applied:
                self._post(Ack(generation=desired.generation))

    async def logs(self, request: LogsRequest) -> LogsReply:
        """The tail of a replica's worker log, or an error that says why there is none."""
        replica_id = request.replica_id
        reply = {"request_id": request.request_id, "replica_id": replica_id}
        try:
            lines = await asyncio.to_thread(self.supervisor.logs.tail, replica_id, request.tail)
        except Exception as e:  # a disk error, or a bug: said, and the link stays up
            log.warning("cannot read the log of replica %d", replica_id, exc_info=not isinstance(e, OSError))
            return LogsReply(**reply, error=f"cannot read the log of replica {replica_id} on {self.config.name}: {e}")
        if lines is None and self.supervisor.get(replica_id) is None:
            return LogsReply(**reply, error=f"replica {replica_id} has no worker on {self.config.name} and left no "
                             "log there")
        return LogsReply(**reply, lines=lines or [])  # a worker that has not written yet: no lines

    async def apply(self, desired: DesiredState) -> bool:
        """Take its gateway secret and converge the workers to `desired`; False (and nothing done, the secret
        included) when its generation is stale."""
        if self.applied_generation is not None and desired.generation < self.applied_generation:
            log.info(
                "ignoring stale desired state generation %d (applied %d)", desired.generation, self.applied_generation
            )
            return False
        self.gateway.set(desired.gateway_secret)
        await self.replicas.apply(desired)
        self.applied_generation = desired.generation
        return True

    def _on_worker_change(self, handle: WorkerHandle, progress: bool) -> None:
        # A change rides in a report (agent/protocol/outbox.py): the console applies it in one transaction, so a
        # replica never shows ready while its GPU does not yet show the bytes it measured. Loading progress,
        # throttled by the worker, is a status of its own.
        if self._outbox is not None:  # none while disconnected: the report sent on reconnect has everything
            if progress:
                self._outbox.progress(handle.status())
            else:
                self._outbox.changed(handle.status())

    def gpus(self) -> list[GpuInfo]:
        """The backend's GPU reading, with each simulated GPU charged what its workers measured."""
        return self.replicas.gpus()

    def _hello(self) -> Hello:
        return Hello(
            protocol=PROTOCOL_VERSION,
            host=self.config.name,
            agent_version=agent.__version__,
            endpoint=self.endpoint,
            gpus=self.gpus(),
            engines=[EngineInfo(name=name, version=version)
                     for name, version in engines.available(self.config.engine_programs)],
        )

    def _report(self, gone: list[ReplicaStatus] = ()) -> HostReport:
        """What changed since the last report (agent/protocol/reports.py) of: GPUs, replicas (with `gone`, the last
        statuses of replicas changed since and stopped meanwhile), how each deployment was served lately (the
        scheduler's SLO input), and the room left for sleeping replicas."""
        gpus = self.gpus()
        handles = self.supervisor.handles()
        self.metrics.set_gpus(gpus)
        self.metrics.set_replicas([replica_snapshot(h) for h in handles])
        self.metrics.set_failures(self.backoff.totals())
        serving = [
            DeploymentServing(
                deployment=d.deployment, requests=d.requests, request_rate=d.request_rate,
                error_rate=min(d.error_rate, 1.0), queue_depth=d.queue_depth,
                p50_ms=None if d.p50_seconds is None else 1000 * d.p50_seconds,
                p95_ms=None if d.p95_seconds is None else 1000 * d.p95_seconds,
            )
            for d in self.metrics.snapshot().deployments
        ]
        return self._reporter.report(gpus, [h.status() for h in handles], serving, self.replicas.sleep_room(),
                                     gone=gone)


def _endpoint(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()  # a wildcard address is not one a client can dial
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "message"
    return f"{where}: {first['msg']} ({error.error_count()} error(s))"
