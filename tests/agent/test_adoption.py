"""Workers outlive their agent: a restarted agent adopts them (no reload) and serves through them; a worker no agent
comes back for exits after its orphan timeout; --stop-workers-on-exit stops them (torch-free workers:
tests.agent.fake_worker, against the fake console of tests.agent.test_daemon)."""

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
import psutil
import pytest

from agent.cli import build_parser, default_state_dir
from agent.daemon import Agent, AgentConfig
from agent.gpus import SimulatedBackend
from agent.protocol import Ack, Hello, HostReport, ReplicaStatus
from agent.workers import environment, processes, rendezvous
from agent.workers import supervisor as supervisor_module
from agent.workers.messages import WORKER_PROTOCOL, Describe, Description
from agent.workers.rendezvous import StateDirError
from tests.agent.fake_worker import COMMAND
from tests.agent.test_daemon import GATEWAY, INFER_BODY, TOKEN, FakeConsole, alive, desired_state, replica
from tests.conftest import write_model_dir
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def console():
    fake = FakeConsole()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def state_dir(monkeypatch):
    """A short state directory (Unix socket paths hold 107 bytes), torch-free workers, and no worker left behind."""
    monkeypatch.setattr(processes, "WORKER_COMMAND", COMMAND)
    root = Path(tempfile.mkdtemp(prefix="mg-"))
    monkeypatch.setenv("MODELGRID_FAKE_LOADS", str(root / "loads"))
    monkeypatch.setattr(environment, "KEPT_NAMES", environment.KEPT_NAMES | {"MODELGRID_FAKE_LOADS"})  # to workers
    yield root / "state"
    for pid in worker_pids(root):  # each test ends its workers itself; this keeps a failed one from leaking them
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    shutil.rmtree(root, ignore_errors=True)


def worker_pids(root: Path) -> list[int]:
    """Every worker ever loaded under this test, from the fake workers' load log."""
    loads = root / "loads"
    return [int(line.split()[1]) for line in loads.read_text().splitlines()] if loads.exists() else []


def loads(state_dir: Path) -> list[tuple[int, int]]:
    """(replica id, pid) of every load so far."""
    log = state_dir.parent / "loads"
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def model(tmp_path):
    return write_model_dir(tmp_path / "tiny")


class Running:
    """An agent running in this test's loop."""

    def __init__(self, agent: Agent, task: asyncio.Task) -> None:
        self.agent, self.task = agent, task

    async def stop(self) -> None:
        self.agent.request_stop()
        await asyncio.wait_for(self.task, 30)


async def start_agent(console, state_dir, **settings) -> Running:
    config = AgentConfig(console=console.url, token=TOKEN, name="test-host", report_interval=0.2, backoff_min=0.05,
                         backoff_max=0.2, warm_workers=0, state_dir=str(state_dir),
                         **({"orphan_timeout": 30.0} | settings))
    agent = Agent(config, SimulatedBackend("sim:1x80GiB,1x24GiB", host="test-host"))
    task = asyncio.create_task(agent.run())
    await asyncio.wait_for(asyncio.shield(agent.listening.wait()), 10)
    return Running(agent, task)


async def infer(agent: Agent, name: str) -> tuple[int, list]:
    async with aiohttp.ClientSession(headers=GATEWAY) as http:
        async with http.post(f"{agent.endpoint}/v2/models/{name}/infer", json=INFER_BODY) as response:
            body = await response.json()
            return response.status, body["outputs"][0]["data"] if response.status == 200 else body


async def serve_two(console, model) -> tuple[int, int]:
    """Replicas 7 (chat) and 8 (other) ready on the connected agent; their pids."""
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 7, "chat"), replica(model, 8, "other")]))
    chat, other = await console.expect_each((ReplicaStatus, {"replica_id": 7, "state": "ready"}),
                                            (ReplicaStatus, {"replica_id": 8, "state": "ready"}))
    return chat.pid, other.pid


async def test_a_restarted_agent_adopts_its_workers_and_serves_through_them_without_a_reload(console, state_dir,
                                                                                            model):
    first = await start_agent(console, state_dir)
    chat, other = await serve_two(console, model)
    status, data = await infer(first.agent, "chat")
    assert status == 200 and set(data) == {chat}  # the fake worker answers with its pid
    await first.stop()
    assert alive(chat) and alive(other)  # the agent stopped; its workers did not
    assert sorted(p.name for p in (state_dir / "workers").iterdir()) == ["authkey", "replica-7.sock", "replica-8.sock"]

    second = await start_agent(console, state_dir)
    # Adopted before the console said anything: the first report already lists them, ready, same processes.
    await console.expect(Hello)
    report = await console.expect(HostReport)
    assert [(r.replica_id, r.state, r.pid) for r in report.replicas] == [(7, "ready", chat), (8, "ready", other)]
    assert report.replicas[0].measured_bytes == 1500

    # The console wants 7 as it is and no longer 8: 7 is kept (no restart), 8 is stopped as usual.
    await console.send(desired_state(2, [replica(model, 7, "chat")]))
    await console.expect_each((ReplicaStatus, {"replica_id": 8, "state": "stopped"}), (Ack, {"generation": 2}))
    assert second.agent.supervisor.get(7).pid == chat and second.agent.supervisor.get(8) is None
    assert not alive(other) and alive(chat)
    assert not (state_dir / "workers" / "replica-8.sock").exists()
    status, data = await infer(second.agent, "chat")
    assert status == 200 and set(data) == {chat}
    assert sorted(loads(state_dir)) == [(7, chat), (8, other)]  # each loaded once, by the first agent

    # Two agents cannot share a state directory: the second is refused before it starts anything.
    intruder = AgentConfig(console=console.url, token=TOKEN, name="test-host", state_dir=str(state_dir))
    with pytest.raises(StateDirError, match="another agent .* is using the state directory"):
        await Agent(intruder, SimulatedBackend("sim:1x1GiB", host="x")).run()
    assert second.agent.supervisor.get(7).pid == chat

    second.agent.config = dataclasses.replace(second.agent.config, stop_workers_on_exit=True)
    await second.stop()
    assert not alive(chat)


async def test_an_agent_killed_outright_leaves_its_workers_to_the_next_one(console, state_dir, model, tmp_path):
    output = open(tmp_path / "agent.log", "w")  # noqa: SIM115 - a file, not a pipe: a surviving worker holds it
    env = os.environ | {"MODELGRID_AGENT_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.agent.fake_agent", "run", "--console", console.url, "--name", "test-host",
         "--gpus", "sim:1x80GiB,1x24GiB", "--state-dir", str(state_dir), "--warm-workers", "1",
         "--report-interval", "0.2"],
        cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
    )
    try:
        await console.expect(Hello, timeout=30)
        await console.send(desired_state(1, [replica(model, 7, "chat")]))
        ready = await console.expect(ReplicaStatus, replica_id=7, state="ready")
        spares = [p.pid for p in psutil.Process(proc.pid).children() if p.pid != ready.pid]
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        output.close()
    await until(lambda: not any(alive(pid) for pid in spares), 10, "the warm spare to die with its agent")
    assert alive(ready.pid), (tmp_path / "agent.log").read_text()

    second = await start_agent(console, state_dir, stop_workers_on_exit=True)
    await console.expect(Hello)
    report = await console.expect(HostReport)
    assert [(r.replica_id, r.state, r.pid) for r in report.replicas] == [(7, "ready", ready.pid)]
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    await console.expect(Ack, generation=1)
    status, data = await infer(second.agent, "chat")
    assert status == 200 and set(data) == {ready.pid}
    assert loads(state_dir) == [(7, ready.pid)]
    await second.stop()  # --stop-workers-on-exit: this time the worker goes with the agent
    assert not alive(ready.pid) and not (state_dir / "workers" / "replica-7.sock").exists()


async def test_a_worker_whose_agent_never_returns_exits_after_its_orphan_timeout(console, state_dir, model):
    agent = await start_agent(console, state_dir, orphan_timeout=1.0)
    chat, other = await serve_two(console, model)
    await agent.stop()
    assert alive(chat) and alive(other)
    await until(lambda: not alive(chat) and not alive(other), 15, "the orphaned workers to exit by themselves")
    assert sorted(p.name for p in (state_dir / "workers").iterdir()) == ["authkey"]  # each removed its socket


async def test_stop_workers_on_exit_stops_them_with_the_agent(console, state_dir, model):
    agent = await start_agent(console, state_dir, stop_workers_on_exit=True)
    chat, other = await serve_two(console, model)
    await agent.stop()
    assert not alive(chat) and not alive(other)
    assert sorted(p.name for p in (state_dir / "workers").iterdir()) == ["authkey"]


async def test_a_connection_without_the_key_is_refused_and_a_stale_socket_is_removed(console, state_dir, model):
    agent = await start_agent(console, state_dir)
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    ready = await console.expect(ReplicaStatus, replica_id=7, state="ready")
    await agent.stop()
    path = state_dir / "workers" / "replica-7.sock"
    with pytest.raises(Exception, match="digest sent was rejected"):
        await asyncio.to_thread(rendezvous.connect, path, b"a key of someone else")
    conn = await asyncio.to_thread(rendezvous.connect, path, (state_dir / "workers" / "authkey").read_bytes())
    conn.send(Describe())
    described = await asyncio.to_thread(conn.recv)
    assert isinstance(described, Description) and (described.pid, described.state) == (ready.pid, "ready")
    conn.close()
    # A socket no worker listens on any more (its worker was killed), left behind in the directory.
    stale = rendezvous.listen(str(state_dir / "workers" / "replica-9.sock"))
    stale.close()

    again = await start_agent(console, state_dir, stop_workers_on_exit=True)
    await console.expect(Hello)
    report = await console.expect(HostReport)
    assert [(r.replica_id, r.pid) for r in report.replicas] == [(7, ready.pid)]
    assert not (state_dir / "workers" / "replica-9.sock").exists()
    await again.stop()
    assert not alive(ready.pid)


async def test_a_worker_of_another_worker_protocol_is_stopped_and_its_replica_loads_afresh(console, state_dir,
                                                                                          model, monkeypatch):
    first = await start_agent(console, state_dir)
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    old = await console.expect(ReplicaStatus, replica_id=7, state="ready")
    await first.stop()
    monkeypatch.setattr(supervisor_module, "WORKER_PROTOCOL", WORKER_PROTOCOL + 1)  # as a newer agent would

    second = await start_agent(console, state_dir, stop_workers_on_exit=True)
    await console.expect(Hello)
    assert (await console.expect(HostReport)).replicas == []
    await until(lambda: not alive(old.pid), 10, "the incompatible worker to stop")
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    new = await console.expect(ReplicaStatus, replica_id=7, state="ready")
    assert new.pid != old.pid and loads(state_dir) == [(7, old.pid), (7, new.pid)]
    await second.stop()
    assert not alive(new.pid)


def test_the_command_line_leaves_workers_running_unless_told_and_names_a_state_dir():
    args = build_parser().parse_args(["run", "--console", "http://c"])
    assert args.stop_workers_on_exit is False and args.orphan_timeout == 60 and args.state_dir is None
    args = build_parser().parse_args(["run", "--console", "http://c", "--stop-workers-on-exit",
                                      "--orphan-timeout", "5"])
    assert args.stop_workers_on_exit is True and args.orphan_timeout == 5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--console", "http://c", "--orphan-timeout", "0"])
    assert default_state_dir("gpu-7", {"MODELGRID_DATA_DIR": "/data"}) == "/data/agents/gpu-7"
    assert default_state_dir("a/b", {"XDG_STATE_HOME": "/st"}) == "/st/modelgrid/agents/a_b"
    assert default_state_dir("h", {"HOME": "/home/u"}).endswith("/.local/state/modelgrid/agents/h")


async def test_a_real_worker_is_adopted_with_its_model_and_serves_the_same_logits(console, tmp_path):
    from agent.workers.demo_models import build_tiny_llama

    root = Path(tempfile.mkdtemp(prefix="mg-"))
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    ready = None
    try:
        first = await start_agent(console, root / "state")
        await console.expect(Hello)
        await console.send(desired_state(1, [replica(llama, 7, "chat")]))
        ready = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=90)
        before = await infer(first.agent, "chat")
        await first.stop()

        second = await start_agent(console, root / "state", stop_workers_on_exit=True)
        await console.expect(Hello)
        await console.send(desired_state(1, [replica(llama, 7, "chat")]))
        await console.expect(Ack, generation=1)
        handle = second.agent.supervisor.get(7)
        assert (handle.pid, handle.state, handle.measured_bytes) == (ready.pid, "ready", ready.measured_bytes)
        after = await infer(second.agent, "chat")
        assert before[0] == after[0] == 200 and before[1] == after[1]
        await second.stop()
        assert not alive(ready.pid)
    finally:
        if ready is not None:  # a failure must not leave the worker waiting out its orphan timeout
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(ready.pid).kill()
        shutil.rmtree(root, ignore_errors=True)
