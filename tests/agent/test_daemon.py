"""The agent against a fake console: a websocket server in the test that checks the bearer token."""

import asyncio
import logging
import os
import signal
import time

import aiohttp
import psutil
import pytest
from aiohttp import web

from agent.artifacts import read_safetensors_header
from agent.daemon import Agent, AgentConfig, websocket_url
from agent.gpus import SimulatedBackend
from agent.protocol import (
    Ack,
    DesiredReplica,
    DesiredState,
    Hello,
    HostReport,
    ReplicaStatus,
    dump,
    parse_agent_message,
)
from agent.protocol.reports import FULL_REPORT_EVERY
from agent.workers.demo_models import build_tiny_llama
from tests.agent.test_cpu_workers import build_wide_vocab_llama
from tests.waiting import until

TOKEN = "mg_agent_right"
GATEWAY_SECRET = "mg_gateway_right"
GATEWAY = {"Authorization": f"Bearer {GATEWAY_SECRET}"}
GIB = 1 << 30
LOAD_S = 180  # a worker's start and load (torch's import alone) on a loaded machine: a bound, not a speed


class FakeConsole:
    """Accepts agents with the right token at /ws/agent/ and queues what they send."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue = asyncio.Queue()
        self.sockets: list[web.WebSocketResponse] = []
        self.refused = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/ws/agent/", self.agent_link)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def agent_link(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.refused += 1
            return web.Response(status=403)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append(ws)
        async for message in ws:
            parsed = parse_agent_message(message.data)
            await self.messages.put(parsed)
            if isinstance(parsed, HostReport):  # state changes ride in reports; the console takes them alike
                for status in parsed.replicas:
                    await self.messages.put(status)
        return ws

    async def send(self, message) -> None:
        await self.sockets[-1].send_str(dump(message))

    async def expect(self, kind, timeout: float = 30, **fields):
        """The next message of `kind` whose fields match; others are skipped. Bounded by `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind.__name__} with {fields} within {timeout} s")
            message = await asyncio.wait_for(self.messages.get(), remaining)
            if isinstance(message, kind) and all(getattr(message, k) == v for k, v in fields.items()):
                return message

    async def full_report(self, gpus: int = 2) -> HostReport:
        """The next report that lists every GPU and replica (periodic ones list only what changed)."""
        while len((report := await self.expect(HostReport)).gpus) < gpus:
            pass
        return report

    async def expect_each(self, *wanted, timeout: float = 30):
        """Messages matching each (kind, fields) pair, arriving in any order; returned in the order asked."""
        found: list = [None] * len(wanted)
        deadline = time.monotonic() + timeout
        while any(f is None for f in found):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [(k.__name__, f) for (k, f), m in zip(wanted, found, strict=True) if m is None]
                raise TimeoutError(f"no {missing} within {timeout} s")
            message = await asyncio.wait_for(self.messages.get(), remaining)
            for i, (kind, fields) in enumerate(wanted):
                if found[i] is None and isinstance(message, kind) and all(
                    getattr(message, k) == v for k, v in fields.items()
                ):
                    found[i] = message
                    break
        return found

    async def stop(self) -> None:
        for ws in self.sockets:
            await ws.close()
        await self.runner.cleanup()


@pytest.fixture
async def console():
    fake = FakeConsole()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def run_agent(console):
    started = []

    async def start(token: str = TOKEN, **settings) -> Agent:
        config = AgentConfig(
            console=console.url,
            token=token,
            name="test-host",
            report_interval=0.2,
            backoff_min=0.05,
            backoff_max=0.2,
            restart_backoff_min=0.1,
            **settings,
        )
        agent = Agent(config, SimulatedBackend("sim:1x80GiB,1x24GiB", host="test-host"))
        task = asyncio.create_task(agent.run())
        started.append((agent, task))
        await asyncio.wait_for(agent.listening.wait(), 10)
        return agent

    yield start
    for agent, task in started:
        # Every process the agent started, replicas and warm spares: none may outlive it.
        pids = [h.pid for h in agent.supervisor.handles() if h.pid] + [s.pid for s in agent.supervisor.spares.spares()]
        agent.request_stop()
        await asyncio.wait_for(task, 30)
        assert agent.supervisor.handles() == []
        assert [pid for pid in pids if alive(pid)] == []


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def replica(path, replica_id=7, deployment="chat", state="ready", **extra) -> DesiredReplica:
    return DesiredReplica(
        id=replica_id,
        deployment=deployment,
        model_path=str(path),
        architecture="LlamaForCausalLM",
        gpus=[1],
        state=state,
        **({"reserved_bytes": GIB} | extra),
    )


def desired_state(generation, replicas, gateway_secret=GATEWAY_SECRET) -> DesiredState:
    """A desired state as the console sends it, with this host's gateway secret."""
    return DesiredState(generation=generation, replicas=replicas, gateway_secret=gateway_secret)


def test_it_derives_the_websocket_url_from_the_console_url():
    assert websocket_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/ws/agent/"
    assert websocket_url("https://grid.example") == "wss://grid.example/ws/agent/"
    with pytest.raises(ValueError, match="must start with http://"):
        websocket_url("127.0.0.1:8000")


async def test_it_converges_to_the_desired_state_reports_and_serves(console, run_agent, tmp_path):
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    agent = await run_agent()

    hello = await console.expect(Hello)
    assert hello.host == "test-host" and hello.protocol == 1 and hello.endpoint == agent.endpoint
    assert hello.endpoint.startswith("http://127.0.0.1:")
    assert [(g.uuid, g.total_bytes, g.used_bytes) for g in hello.gpus] == [
        ("SIM-test-host-0", 80 * GIB, 0),
        ("SIM-test-host-1", 24 * GIB, 0),
    ]
    assert (await console.expect(HostReport)).replicas == []

    await console.send(desired_state(generation=3, replicas=[replica(llama)]))
    starting, _ = await console.expect_each((ReplicaStatus, {"replica_id": 7}), (Ack, {"generation": 3}))
    assert starting.state == "starting" and starting.pid
    loading = await console.expect(ReplicaStatus, replica_id=7, state="loading", timeout=LOAD_S)
    assert loading.pid == starting.pid and loading.total_bytes > 0 and loading.loaded_bytes == 0
    ready = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=LOAD_S)
    assert ready.measured_bytes == ready.measurement.total_bytes > 0 and ready.pid == loading.pid
    assert ready.loaded_bytes == ready.total_bytes == loading.total_bytes

    # The simulated GPU the replica was placed on is charged what the worker measured. Periodic reports list
    # only what changed since the previous one; every FULL_REPORT_EVERY-th lists everything.
    report = await console.full_report()
    assert [g.used_bytes for g in report.gpus] == [0, ready.measured_bytes]
    assert [g.own_bytes for g in report.gpus] == [0, ready.measured_bytes]  # all of it the agent's own
    assert [(r.replica_id, r.state) for r in report.replicas] == [(7, "ready")]

    body = {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}]}
    async with aiohttp.ClientSession(headers=GATEWAY) as http:
        async with http.post(f"{agent.endpoint}/v2/models/chat/infer", json=body) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["outputs"][0]["shape"] == [1, 3, 1024]

    # The console drops the link: the agent reconnects and the worker keeps running.
    await console.sockets[-1].close()
    hello = await console.expect(Hello, timeout=10)
    report = await console.expect(HostReport)
    assert [(r.replica_id, r.state, r.pid) for r in report.replicas] == [(7, "ready", loading.pid)]
    await console.send(desired_state(generation=3, replicas=[replica(llama)]))  # the console resends
    await console.expect(Ack, generation=3)
    assert agent.supervisor.get(7).pid == loading.pid

    # An empty desired state stops the worker; a stale one afterwards is ignored (no ack, nothing started).
    await console.send(desired_state(generation=4, replicas=[]))
    await console.expect_each((ReplicaStatus, {"replica_id": 7, "state": "stopped"}), (Ack, {"generation": 4}))
    assert not psutil.pid_exists(loading.pid)
    await console.send(desired_state(generation=2, replicas=[replica(llama)]))
    with pytest.raises(TimeoutError):
        await console.expect(Ack, timeout=0.6)
    assert agent.supervisor.handles() == [] and agent.applied_generation == 4


async def test_a_crashed_worker_is_reported_and_restarted(console, run_agent, tmp_path):
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    agent = await run_agent()
    await console.expect(Hello)
    await console.send(desired_state(generation=1, replicas=[replica(llama, index=0)]))
    first = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=LOAD_S)

    psutil.Process(first.pid).kill()
    crashed = await console.expect(ReplicaStatus, replica_id=7, state="failed", timeout=10)
    assert crashed.reason == ("worker process was killed by signal SIGKILL while serving; restarts in 0.1 s "
                              "(failure 1 in a row)")
    again = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=LOAD_S)
    assert again.pid != first.pid and psutil.pid_exists(again.pid)
    assert agent.backoff.failures(7) == 1  # a ready worker ends the run of failures only once it stayed up
    # ... but not the count Prometheus sees, which the next report hands to the metrics.
    labels = {"deployment": "chat", "replica": "chat#0"}  # as the console's pages name it
    await until(lambda: agent.metrics.registry.get_sample_value("modelgrid_replica_failures_total", labels) == 1,
                10, "the failure counted in the metrics")


async def test_a_replica_that_cannot_load_is_reported_failed_and_retried_only_on_a_new_generation(
    console, run_agent, tmp_path
):
    agent = await run_agent()
    await console.expect(Hello)
    missing = replica(tmp_path / "nowhere", replica_id=9)
    await console.send(desired_state(generation=1, replicas=[missing]))
    failed, _ = await console.expect_each((ReplicaStatus, {"replica_id": 9}), (Ack, {"generation": 1}))
    assert failed.state == "failed" and failed.reason == f"{tmp_path / 'nowhere'}: no such directory"

    await console.send(desired_state(generation=1, replicas=[missing]))  # the same generation again
    await console.expect(Ack, generation=1)
    await console.expect(HostReport)  # a report interval later: still failed, not retried
    statuses = [h.status() for h in agent.supervisor.handles()]
    assert [(r.replica_id, r.state, r.reason) for r in statuses] == [(9, "failed", failed.reason)]

    await console.send(desired_state(generation=2, replicas=[missing]))  # a new generation: one retry
    await console.expect_each((ReplicaStatus, {"replica_id": 9, "state": "stopped"}),
                              (ReplicaStatus, {"replica_id": 9, "state": "failed"}), (Ack, {"generation": 2}))

    # `stopped` replicas do not run.
    await console.send(desired_state(generation=3, replicas=[replica(tmp_path, replica_id=9, state="stopped")]))
    await console.expect(Ack, generation=3)
    assert agent.supervisor.handles() == []


async def test_it_logs_a_malformed_console_message_and_carries_on(console, run_agent, caplog):
    await run_agent()
    await console.expect(Hello)
    await console.sockets[-1].send_str('{"type": "desired_state", "generation": -1, "replicas": []}')
    await console.sockets[-1].send_str('{"type": "error", "reason": "hello from the wrong host"}')
    await console.send(desired_state(generation=1, replicas=[]))
    await console.expect(Ack, generation=1)
    assert "ignoring a console message that does not validate: desired_state.generation" in caplog.text
    assert "the console reports an error: hello from the wrong host" in caplog.text


async def test_a_refused_token_is_logged_and_retried(console, run_agent, caplog):
    caplog.set_level(logging.INFO, logger="agent.daemon")
    await run_agent(token="mg_agent_wrong")
    deadline = time.monotonic() + 10
    while console.refused < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert console.refused >= 3 and console.sockets == []
    assert "console refused the agent token (HTTP 403)" in caplog.text


async def test_it_keeps_retrying_while_the_console_is_down(run_agent, caplog, console):
    await console.stop()  # nothing listens on that port any more
    agent = await run_agent()
    await asyncio.sleep(0.5)
    assert "cannot reach the console" in caplog.text and agent.endpoint


async def get_status(agent, path, secret=None):
    headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.get(f"{agent.endpoint}{path}") as response:
            return response.status, await response.json(content_type=None) if path != "/metrics" else None


async def test_the_inference_port_takes_the_gateway_secret_of_each_fresh_desired_state(console, run_agent):
    agent = await run_agent()
    await console.expect(Hello)
    # No desired state yet: only liveness answers.
    assert (await get_status(agent, "/v2/health/live"))[0] == 200
    status, body = await get_status(agent, "/v2", secret="anything")
    assert status == 401 and "has no gateway secret yet" in body["error"]

    await console.send(desired_state(generation=5, replicas=[], gateway_secret="first"))
    await console.expect(Ack, generation=5)
    assert (await get_status(agent, "/v2", secret="first"))[0] == 200
    assert (await get_status(agent, "/metrics", secret="first"))[0] == 200
    assert (await get_status(agent, "/metrics"))[0] == 401
    status, body = await get_status(agent, "/v1/models", secret="wrong")
    assert status == 401 and body["error"]["code"] == "invalid_gateway_secret"

    # A stale generation is ignored, its secret with the rest of it.
    await console.send(desired_state(generation=4, replicas=[], gateway_secret="stale"))
    await console.send(desired_state(generation=5, replicas=[], gateway_secret="first"))  # ordered after it
    await console.expect(Ack, generation=5)
    assert (await get_status(agent, "/v2", secret="stale"))[0] == 401
    assert (await get_status(agent, "/v2", secret="first"))[0] == 200

    # The secret survives a reconnect (in memory); a newer desired state's secret replaces it.
    await console.sockets[-1].close()
    await console.expect(Hello, timeout=10)
    assert (await get_status(agent, "/v2", secret="first"))[0] == 200
    await console.send(desired_state(generation=6, replicas=[], gateway_secret="second"))
    await console.expect(Ack, generation=6)
    assert (await get_status(agent, "/v2", secret="first"))[0] == 401
    assert (await get_status(agent, "/v2", secret="second"))[0] == 200
    assert (await get_status(agent, "/v2/health/live"))[0] == 200


INFER_BODY = {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}]}


async def post_infer(agent, name):
    async with aiohttp.ClientSession(headers=GATEWAY) as http:
        async with http.post(f"{agent.endpoint}/v2/models/{name}/infer", json=INFER_BODY) as response:
            return response.status, await response.json()


async def test_it_sleeps_one_model_wakes_another_and_switches_to_a_preloaded_one(console, run_agent, tmp_path):
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    agent = await run_agent()
    await console.expect(Hello)
    a = replica(llama, replica_id=1, deployment="a", mps_percentage=30)
    b = replica(llama, replica_id=2, deployment="b", state="sleeping")
    await console.send(desired_state(generation=1, replicas=[a, b]))
    ready_a, asleep_b = await console.expect_each(
        (ReplicaStatus, {"replica_id": 1, "state": "ready"}),
        (ReplicaStatus, {"replica_id": 2, "state": "sleeping"}),  # loaded, then put to sleep
        timeout=LOAD_S,
    )
    assert ready_a.mps_percentage == 30  # a simulated GPU records the MPS share
    assert asleep_b.host_bytes >= asleep_b.measurement.weights_bytes and asleep_b.sleep_wake.direction == "sleep"
    report = await console.full_report()
    assert report.gpus[1].used_bytes == ready_a.measured_bytes  # a sleeping replica holds no device memory

    # Generation 2 sleeps `a` and wakes `b`: the same workers, moved in place.
    await console.send(desired_state(generation=2, replicas=[a.model_copy(update={"state": "sleeping"}),
                                                            b.model_copy(update={"state": "ready"})]))
    _, woke_b, _ = await console.expect_each(
        (ReplicaStatus, {"replica_id": 1, "state": "sleeping"}),
        (ReplicaStatus, {"replica_id": 2, "state": "ready"}),
        (Ack, {"generation": 2}),
    )
    assert woke_b.pid == asleep_b.pid and woke_b.sleep_wake.direction == "wake"
    assert (await post_infer(agent, "b"))[0] == 200

    # A stale generation is ignored: nothing moves and nothing is acknowledged.
    await console.send(desired_state(generation=1, replicas=[a, b]))
    with pytest.raises(TimeoutError):
        await console.expect(Ack, timeout=0.6)
    assert [(h.spec.replica_id, h.state) for h in agent.supervisor.handles()] == [(1, "sleeping"), (2, "ready")]

    # A request for the sleeping `a` is a 503 at once, saying why; it stays asleep (only the console wakes it).
    async with asyncio.timeout(5):
        status, body = await post_infer(agent, "a")
    assert status == 503 and body == {"error": "model 'a' is not ready: replica 1 of 'a' is sleeping"}
    assert agent.supervisor.get(1).state == "sleeping" and agent.supervisor.get(1).pid == ready_a.pid
    await console.send(desired_state(generation=2, replicas=[a.model_copy(update={"state": "sleeping"}),
                                                            b.model_copy(update={"state": "ready"})]))
    await console.expect(Ack, generation=2)
    assert agent.supervisor.get(1).state == "sleeping"

    # Generation 3 stages `a` (already on its device) while `b` serves; generation 4 switches to it.
    await console.send(desired_state(generation=3, replicas=[a.model_copy(update={"state": "preloaded"}),
                                                            b.model_copy(update={"state": "ready"})]))
    await console.expect_each((ReplicaStatus, {"replica_id": 1, "state": "preloaded"}), (Ack, {"generation": 3}))
    await console.send(desired_state(generation=4, replicas=[a, b.model_copy(update={"state": "stopped"})]))
    promoted, _, _ = await console.expect_each(
        (ReplicaStatus, {"replica_id": 1, "state": "ready"}),
        (ReplicaStatus, {"replica_id": 2, "state": "stopped"}),
        (Ack, {"generation": 4}),
    )
    assert promoted.pid == ready_a.pid and not alive(woke_b.pid)
    assert (await post_infer(agent, "a"))[0] == 200


async def test_sleepers_beyond_the_host_budget_are_evicted_least_recently_used_first(console, run_agent, tmp_path):
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    size = sum(t.nbytes for t in read_safetensors_header(llama / "model.safetensors"))
    agent = await run_agent(sleep_budget=int(size * 1.5))  # room for one sleeping tiny-llama, not two
    await console.expect(Hello)
    first = replica(llama, replica_id=1, deployment="first")
    second = replica(llama, replica_id=2, deployment="second")
    await console.send(desired_state(generation=1, replicas=[first, second]))
    await console.expect_each((ReplicaStatus, {"replica_id": 1, "state": "ready"}),
                              (ReplicaStatus, {"replica_id": 2, "state": "ready"}), timeout=LOAD_S)
    assert (await post_infer(agent, "second"))[0] == 200  # `second` is now the more recently used

    await console.send(desired_state(generation=2, replicas=[first.model_copy(update={"state": "sleeping"}),
                                                            second.model_copy(update={"state": "sleeping"})]))
    evicted, _, _ = await console.expect_each(
        (ReplicaStatus, {"replica_id": 1, "state": "stopped"}),
        (ReplicaStatus, {"replica_id": 2, "state": "sleeping"}),
        (Ack, {"generation": 2}),
    )
    assert evicted.reason.startswith("evicted from host memory: sleeping replicas needed")
    assert "least recently used" in evicted.reason and "--sleep-budget" in evicted.reason

    # The same generation again leaves the evicted replica stopped (no load-evict loop).
    await console.send(desired_state(generation=2, replicas=[first.model_copy(update={"state": "sleeping"}),
                                                            second.model_copy(update={"state": "sleeping"})]))
    await console.expect(Ack, generation=2)
    report = await console.full_report()
    assert [(r.replica_id, r.state) for r in report.replicas] == [(1, "stopped"), (2, "sleeping")]


async def test_a_hung_worker_is_reported_and_replaced(console, run_agent, tmp_path):
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    await run_agent(heartbeat_interval=0.2, heartbeat_timeout=1.0)
    await console.expect(Hello)
    await console.send(desired_state(generation=1, replicas=[replica(llama)]))
    first = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=LOAD_S)

    os.kill(first.pid, signal.SIGSTOP)
    hung = await console.expect(ReplicaStatus, replica_id=7, state="failed", timeout=15)
    assert hung.reason == "no heartbeat for 1 s; restarts in 0.1 s (failure 1 in a row)"
    again = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=LOAD_S)
    assert again.pid != first.pid and not alive(first.pid)


async def test_a_request_out_of_memory_is_a_507_and_harms_no_other_replica(console, run_agent, tmp_path):
    llama = build_wide_vocab_llama(tmp_path / "wide-vocab-llama")  # [64, 256] tokens: 1 GiB of logits
    agent = await run_agent(cap_cpu_workers=True, cpu_threads=1)
    await console.expect(Hello)
    # Each CPU worker is held to its reservation (1 MiB here) plus room for threads and the mapped file.
    small = [replica(llama, replica_id=i, deployment=name, reserved_bytes=1 << 20) for i, name in ((1, "a"), (2, "b"))]
    await console.send(desired_state(generation=1, replicas=small))
    await console.expect_each((ReplicaStatus, {"replica_id": 1, "state": "ready"}),
                              (ReplicaStatus, {"replica_id": 2, "state": "ready"}), timeout=LOAD_S)
    huge = {"inputs": [{"name": "input_ids", "shape": [64, 256], "datatype": "INT64", "data": [1] * (64 * 256)}]}
    async with aiohttp.ClientSession(headers=GATEWAY) as http:
        async with http.post(f"{agent.endpoint}/v2/models/a/infer", json=huge) as response:
            assert response.status == 507
            assert (await response.json())["error"].startswith("model 'a' cannot take this request: out of memory")
    assert (await post_infer(agent, "a"))[0] == 200 and (await post_infer(agent, "b"))[0] == 200
    assert [(h.spec.replica_id, h.state) for h in agent.supervisor.handles()] == [(1, "ready"), (2, "ready")]


async def test_periodic_reports_carry_only_what_changed_with_a_full_one_now_and_then(console, run_agent):
    await run_agent()
    await console.expect(Hello)
    first = await console.expect(HostReport)
    assert [g.index for g in first.gpus] == [0, 1]  # the first on a link is whole
    quiet = [await console.expect(HostReport) for _ in range(FULL_REPORT_EVERY - 1)]
    assert first.serving == [] and first.ram_free_bytes is not None
    # Nothing changed: nothing listed, and serving and the sleep room are "as before" (None).
    assert all(r.gpus == [] and r.replicas == [] and r.serving is None and r.ram_free_bytes is None for r in quiet)
    resync = await console.expect(HostReport)  # the periodic resync
    assert [g.index for g in resync.gpus] == [0, 1] and resync.serving == [] and resync.ram_free_bytes is not None
