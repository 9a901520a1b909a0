"""The agent daemon: serves inference, keeps a websocket to the console, and converges workers to
the desired state the console sends.

Message flow on each connection: agent sends hello, then a report; then a report every
`report_interval` seconds and a replica_status on every worker state change; the console sends
desired_state (answered by an ack once applied) or error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass

import aiohttp
from pydantic import BaseModel, ValidationError

import agent
from agent.artifacts import ArtifactError, inspect_model_dir
from agent.artifacts.model_dir import CAUSAL_LM_SUFFIXES
from agent.converge import Running, device_for, plan_convergence
from agent.gpus import GpuBackend
from agent.protocol import (
    PROTOCOL_VERSION,
    Ack,
    DesiredReplica,
    DesiredState,
    ErrorReply,
    GpuInfo,
    Hello,
    HostReport,
    dump,
    parse_console_message,
)
from agent.restarts import RestartBackoff
from agent.serving import make_app, start_server
from agent.workers.spec import DTYPES, WorkerSpec
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
    """One host's agent; `run()` until `request_stop()`, then every worker is stopped."""

    def __init__(self, config: AgentConfig, backend: GpuBackend) -> None:
        self.config = config
        self.backend = backend
        self.ws_url = websocket_url(config.console)
        self.supervisor = Supervisor(on_change=self._on_worker_change, warm_spares=config.warm_workers)
        self.endpoint = ""
        self.listening = asyncio.Event()
        self.applied_generation: int | None = None
        self._placements: dict[int, DesiredReplica] = {}
        self._generations: dict[int, int] = {}  # replica id -> generation its worker was started under
        self._outbox: asyncio.Queue[str] | None = None
        self._stop = asyncio.Event()
        self.backoff = RestartBackoff(config.restart_backoff_min, config.restart_backoff_max)
        self._restart_timers: dict[int, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()

    def request_stop(self) -> None:
        """Ask `run()` to stop the workers and return (safe from a signal handler on the loop)."""
        self._stop.set()

    async def run(self) -> None:
        """Serve inference and stay connected to the console until asked to stop."""
        runner, port = await start_server(make_app(self.supervisor), self.config.listen_host, self.config.listen_port)
        self.endpoint = self.config.advertise.rstrip("/") or _endpoint(self.config.listen_host, port)
        print(f"ModelGrid agent {self.config.name} serving inference on {self.endpoint}", flush=True)
        self.listening.set()
        try:
            self.supervisor.start_spares()
            # Bounded handshake; aiohttp lifts the read timeout once the websocket is open.
            timeout = aiohttp.ClientTimeout(total=None, connect=15, sock_read=30)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                link = asyncio.create_task(self._stay_connected(session))
                await self._stop.wait()
                for timer in self._restart_timers.values():
                    timer.cancel()
                log.info("stopping: %d worker(s)", len(self.supervisor.handles()))
                await self.supervisor.stop_all()
                await self._flush()  # let the console hear the replicas stopped
                link.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await link
        finally:
            await self.supervisor.stop_all()
            await runner.cleanup()

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
        outbox: asyncio.Queue[str] = asyncio.Queue()
        self._outbox = outbox
        # A new connection may face a console restored from a backup, whose generations restart:
        # staleness is judged within one connection (messages cannot cross connections).
        self.applied_generation = None
        self._post(self._hello())
        self._post(self._report())
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

    async def _send_loop(self, ws: aiohttp.ClientWebSocketResponse, outbox: asyncio.Queue[str]) -> None:
        # One writer per connection keeps messages in order (hello first, statuses as they happened).
        try:
            while True:
                text = await outbox.get()
                await ws.send_str(text)
                outbox.task_done()
        except (aiohttp.ClientError, ConnectionError) as e:
            log.warning("cannot send to the console: %s", e)
            await ws.close()

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.report_interval)
            self._post(self._report())

    async def _flush(self) -> None:
        if self._outbox is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._outbox.join(), _FLUSH_ON_EXIT_S)

    def _post(self, message: BaseModel) -> None:
        # Dropped while disconnected: the report sent on reconnect carries every replica's state.
        if self._outbox is not None:
            self._outbox.put_nowait(dump(message))

    async def _on_console_message(self, text: str) -> None:
        try:
            message = parse_console_message(text)
        except ValidationError as e:
            log.warning("ignoring a console message that does not validate: %s", _first_error(e))
            return
        if isinstance(message, ErrorReply):
            log.error("the console reports an error: %s", message.reason)
        elif isinstance(message, DesiredState):
            try:
                applied = await self.apply(message)
            except Exception:  # a bug here must not cut the link; the console resends on reconnect
                log.exception("cannot apply desired state generation %d", message.generation)
                return
            if applied:
                self._post(Ack(generation=message.generation))

    async def apply(self, desired: DesiredState) -> bool:
        """Converge the workers to `desired`; False (and nothing done) when its generation is stale."""
        if self.applied_generation is not None and desired.generation < self.applied_generation:
            log.info(
                "ignoring stale desired state generation %d (applied %d)", desired.generation, self.applied_generation
            )
            return False
        running = {
            h.spec.replica_id: Running(h.spec, h.state, self._generations.get(h.spec.replica_id, -1))
            for h in self.supervisor.handles()
        }
        plan = plan_convergence(desired, running, self.backend.device_kind)
        for reason in plan.reasons:
            log.info("generation %d: %s", desired.generation, reason)
        await asyncio.gather(*(self.supervisor.stop(replica_id) for replica_id in plan.stop))
        for replica in plan.start:
            self._start(replica)
            self._generations[replica.id] = desired.generation
        self._placements = {r.id: r for r in desired.replicas}
        self._generations = {k: v for k, v in self._generations.items() if self.supervisor.get(k)}
        self.applied_generation = desired.generation
        return True

    def _start(self, replica: DesiredReplica) -> WorkerHandle:
        device = device_for(replica, self.backend.device_kind)
        try:
            # Read torch-free before spawning: a bad directory fails in milliseconds, with a message
            # that names the file, instead of after a worker has imported torch.
            task = inspect_model_dir(replica.model_path).task
            if replica.dtype not in DTYPES:
                raise ArtifactError(f"dtype {replica.dtype!r} is not supported ({', '.join(DTYPES)})")
        except ArtifactError as e:
            guess = "causal-lm" if replica.architecture.endswith(CAUSAL_LM_SUFFIXES) else "encoder"
            spec = WorkerSpec(replica.id, replica.model_path, guess, device, replica.dtype, replica.deployment)
            return self.supervisor.add_failed(spec, str(e))
        spec = WorkerSpec(replica.id, replica.model_path, task, device, replica.dtype, replica.deployment)
        return self.supervisor.start(spec)

    def _on_worker_change(self, handle: WorkerHandle) -> None:
        # A report first: the console applies it in one transaction, so a replica never shows ready
        # while its GPU does not yet show the bytes it measured. Then the status event itself.
        self._post(self._report())
        self._post(handle.status())
        replica_id = handle.spec.replica_id
        if handle.state == "ready":
            self.backoff.ready(replica_id)
        elif handle.state == "failed" and handle.pid is not None and not self._stop.is_set():
            # A worker process crashed or failed to load: restart it, backing off so a model that
            # always fails costs little. (A replica refused before any process started is not
            # retried: its directory would be refused again.)
            delay = self.backoff.failed(replica_id)
            log.warning("replica %d failed (%s); restarting in %g s (failure %d in a row)",
                        replica_id, handle.reason, delay, self.backoff.failures(replica_id))
            old = self._restart_timers.pop(replica_id, None)
            if old is not None:
                old.cancel()
            self._restart_timers[replica_id] = asyncio.get_running_loop().call_later(
                delay, self._spawn_task, self._restart(replica_id, handle)
            )

    def _spawn_task(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, replica_id: int, failed: WorkerHandle) -> None:
        self._restart_timers.pop(replica_id, None)
        replica = self._placements.get(replica_id)
        # Only the same failed worker of a replica that is still wanted: the desired state may
        # have moved on while we waited.
        if replica is None or replica.state != "ready" or self.supervisor.get(replica_id) is not failed:
            return
        await self.supervisor.stop(replica_id)
        if self.supervisor.get(replica_id) is None and not self._stop.is_set():
            log.info("replica %d: restarting its worker", replica_id)
            self._start(replica)

    def gpus(self) -> list[GpuInfo]:
        """The backend's GPU reading, with each simulated GPU charged what its workers measured."""
        used: dict[int, int] = {}
        for handle in self.supervisor.handles():
            placement = self._placements.get(handle.spec.replica_id)
            if handle.measured_bytes and handle.state == "ready":
                index = placement.gpus[0] if placement and placement.gpus else 0
                used[index] = used.get(index, 0) + handle.measured_bytes
        return self.backend.collect(used)

    def _hello(self) -> Hello:
        return Hello(
            protocol=PROTOCOL_VERSION,
            host=self.config.name,
            agent_version=agent.__version__,
            endpoint=self.endpoint,
            gpus=self.gpus(),
        )

    def _report(self) -> HostReport:
        return HostReport(gpus=self.gpus(), replicas=[h.status() for h in self.supervisor.handles()])


def _endpoint(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()  # a wildcard address is not one a client can dial
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "message"
    return f"{where}: {first['msg']} ({error.error_count()} error(s))"
