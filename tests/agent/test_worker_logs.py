"""Worker logs through the agent: what a replica's workers write (print, logging, straight to fd 2) lands in its
log in the state directory, a logs_request gets its tail (or an error that says why not), a failed load leaves
the worker's own error there, and an adopted worker keeps writing to the same log (torch-free workers:
tests.agent.fake_worker, against the fake console of tests.agent.test_daemon)."""

import asyncio
import dataclasses
import shutil
import tempfile
from pathlib import Path

import aiohttp
import pytest

from agent.daemon import Agent, AgentConfig
from agent.gpus import SimulatedBackend
from agent.protocol import Ack, Hello, LogsReply, LogsRequest, ReplicaStatus
from agent.workers import processes
from tests.agent.fake_worker import COMMAND
from tests.agent.test_daemon import GATEWAY, INFER_BODY, TOKEN, FakeConsole, alive, desired_state, replica
from tests.conftest import write_model_dir


@pytest.fixture
async def console():
    fake = FakeConsole()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def state_dir(monkeypatch):
    """A short state directory (Unix socket paths hold 107 bytes) and torch-free workers."""
    monkeypatch.setattr(processes, "WORKER_COMMAND", COMMAND)
    root = Path(tempfile.mkdtemp(prefix="mg-"))
    yield root / "state"
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def model(tmp_path):
    return write_model_dir(tmp_path / "tiny")


class Running:
    """An agent running in this test's loop."""

    def __init__(self, agent: Agent, task: asyncio.Task) -> None:
        self.agent, self.task = agent, task

    async def stop(self, stop_workers: bool = False) -> None:
        if stop_workers:
            self.agent.config = dataclasses.replace(self.agent.config, stop_workers_on_exit=True)
        self.agent.request_stop()
        await asyncio.wait_for(asyncio.shield(self.task), 30)


@pytest.fixture
async def agents(console):
    """Start agents on the fake console; those still running at the end are stopped with their workers."""
    started: list[Running] = []

    async def start(state_dir: Path | None, **settings) -> Running:
        config = AgentConfig(console=console.url, token=TOKEN, name="test-host", report_interval=0.2,
                             backoff_min=0.05, backoff_max=0.2,
                             state_dir=None if state_dir is None else str(state_dir), **settings)
        agent = Agent(config, SimulatedBackend("sim:1x80GiB,1x24GiB", host="test-host"))
        running = Running(agent, asyncio.create_task(agent.run()))
        started.append(running)
        await asyncio.wait_for(asyncio.shield(agent.listening.wait()), 10)
        return running

    yield start
    for running in started:
        if not running.task.done():
            await running.stop(stop_workers=True)


async def logs_of(console: FakeConsole, replica_id: int, tail: int = 100, request_id: str = "r") -> LogsReply:
    await console.send(LogsRequest(request_id=request_id, replica_id=replica_id, tail=tail))
    return await console.expect(LogsReply, request_id=request_id, timeout=10)


async def infer(running: Running, name: str) -> int:
    async with aiohttp.ClientSession(headers=GATEWAY) as http:
        async with http.post(f"{running.agent.endpoint}/v2/models/{name}/infer", json=INFER_BODY) as response:
            return response.status


async def test_what_a_replicas_worker_writes_lands_in_its_log_and_a_logs_request_gets_the_tail(
        console, agents, state_dir, model):
    await agents(state_dir, warm_workers=1)  # the replica takes over a spare, which knew no replica when spawned
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    ready = await console.expect(ReplicaStatus, replica_id=7, state="ready")

    reply = await logs_of(console, 7)
    assert reply.replica_id == 7 and reply.error == ""
    text = "\n".join(reply.lines)
    assert f"worker {7}: worker pid {ready.pid} for replica 7 (chat) on cpu" in text  # Python logging
    assert f"fake worker {ready.pid}: loading {model}" in text  # print, line by line
    assert f"fake worker {ready.pid}: written to fd 2, as C code does" in text  # the descriptor itself
    assert (state_dir / "logs" / "replica-7.log").read_text().count("\n") == len(reply.lines)

    tail = await logs_of(console, 7, tail=2, request_id="two")
    assert tail.lines == reply.lines[-2:]


async def test_a_failed_load_leaves_the_workers_own_error_in_its_log(console, agents, state_dir, model):
    (model / "fail-load").write_text("tensor model.embed_tokens.weight holds NaN")
    await agents(state_dir)
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 8, "broken")]))
    failed = await console.expect(ReplicaStatus, replica_id=8, state="failed")
    assert failed.reason == ("ValueError: tensor model.embed_tokens.weight holds NaN; restarts in 1 s "
                             "(failure 1 in a row)")

    reply = await logs_of(console, 8)
    assert reply.error == ""
    assert f"ERROR worker 8: cannot load {model}: tensor model.embed_tokens.weight holds NaN" in "\n".join(
        reply.lines)


async def test_a_replica_with_no_worker_and_no_log_here_gets_an_error_reply(console, agents, state_dir):
    await agents(state_dir)
    await console.expect(Hello)
    reply = await logs_of(console, 99)
    assert reply.lines == []
    assert reply.error == "replica 99 has no worker on test-host and left no log there"


async def test_an_adopted_worker_keeps_writing_to_the_same_log(console, agents, state_dir, model):
    first = await agents(state_dir)
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    ready = await console.expect(ReplicaStatus, replica_id=7, state="ready")
    assert await infer(first, "chat") == 200
    await first.stop()  # the worker stays, for the next agent
    assert alive(ready.pid)

    second = await agents(state_dir)
    await console.expect(Hello)
    await console.send(desired_state(2, [replica(model, 7, "chat")]))
    await console.expect(Ack, generation=2)
    assert second.agent.supervisor.get(7).pid == ready.pid
    assert await infer(second, "chat") == 200
    reply = await logs_of(console, 7)
    forwards = [line for line in reply.lines if f"fake worker {ready.pid}: forward of 1 row(s)" in line]
    assert len(forwards) == 2  # one served through each agent, in one log
    assert f"fake worker {ready.pid}: loading {model}" in "\n".join(reply.lines)  # from before the restart


async def test_without_a_state_directory_logs_live_in_a_temporary_directory_gone_with_the_agent(
        console, agents, state_dir, model):
    running = await agents(None)
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    await console.expect(ReplicaStatus, replica_id=7, state="ready")
    reply = await logs_of(console, 7)
    assert any("loading" in line for line in reply.lines)
    root = running.agent.supervisor.logs.root
    await running.stop()
    assert not root.exists()
