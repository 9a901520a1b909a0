"""A replica that leaves its host (scaled down, moved, put to sleep) takes no new requests and finishes those it
has before its worker goes, within the drain timeout (torch-free workers: tests.agent.fake_worker)."""

import asyncio

import pytest

from agent.protocol import Ack, Hello, LogsReply, LogsRequest, ReplicaStatus
from tests.agent import test_adoption
from tests.agent.test_adoption import infer, start_agent
from tests.agent.test_daemon import alive, desired_state, replica
from tests.conftest import write_model_dir
from tests.waiting import until

console, state_dir = test_adoption.console, test_adoption.state_dir  # the fake console, torch-free workers


@pytest.fixture
def slow_model(tmp_path):
    path = write_model_dir(tmp_path / "slow")
    (path / "slow-forward").write_text("1.5")
    return path


async def ready(console, model):
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(model, 7, "chat")]))
    return (await console.expect(ReplicaStatus, replica_id=7, state="ready")).pid


async def test_a_replica_scaled_away_finishes_its_requests_before_its_worker_stops(console, state_dir, slow_model):
    running = await start_agent(console, state_dir)
    try:
        pid = await ready(console, slow_model)
        request = asyncio.ensure_future(infer(running.agent, "chat"))
        await until(lambda: running.agent.supervisor.get(7).picked, 30, "the forward to be under way")
        await console.send(desired_state(2, []))
        await until(lambda: running.agent.supervisor.get(7).draining, 30, "the replica to drain")
        status, body = await infer(running.agent, "chat")  # arrives while it drains: it takes nothing new
        assert status == 503 and "draining" in body["error"]
        status, data = await request
        assert status == 200 and set(data) == {pid}  # answered by the worker, not cut by its stop
        await console.expect_each((ReplicaStatus, {"replica_id": 7, "state": "stopped"}), (Ack, {"generation": 2}))
        assert not alive(pid)
    finally:
        await running.stop()


async def test_a_drain_is_bounded_by_the_drain_timeout(console, state_dir, slow_model):
    (slow_model / "slow-forward").write_text("30")
    running = await start_agent(console, state_dir, drain_timeout=0.5)
    try:
        pid = await ready(console, slow_model)
        request = asyncio.ensure_future(infer(running.agent, "chat"))
        await until(lambda: running.agent.supervisor.get(7).picked, 30, "the forward to be under way")
        await console.send(desired_state(2, []))
        await console.expect_each((ReplicaStatus, {"replica_id": 7, "state": "stopped"}), (Ack, {"generation": 2}),
                                  timeout=20)
        assert (await request)[0] == 503  # the worker went at the deadline, and its request with it
        assert not alive(pid)
    finally:
        await running.stop()


async def test_the_link_is_read_while_a_replica_drains(console, state_dir, slow_model):
    # The console's keepalive pings and its log requests are answered while a drain waits for a request: applying
    # a desired state no longer holds the link's reading.
    running = await start_agent(console, state_dir)
    try:
        await ready(console, slow_model)
        request = asyncio.ensure_future(infer(running.agent, "chat"))
        await until(lambda: running.agent.supervisor.get(7).picked, 30, "the forward to be under way")
        await console.send(desired_state(2, []))
        await until(lambda: running.agent.supervisor.get(7).draining, 30, "the replica to drain")
        await console.send(LogsRequest(request_id="q1", replica_id=7, tail=5))
        reply = await console.expect(LogsReply, request_id="q1")
        assert running.agent.supervisor.get(7) is not None  # answered while the replica still drained
        assert (await request)[0] == 200
        await console.expect_each((ReplicaStatus, {"replica_id": 7, "state": "stopped"}), (Ack, {"generation": 2}))
        assert reply.replica_id == 7
    finally:
        await running.stop()



async def test_an_agent_asked_to_stop_finishes_its_requests_before_its_workers_go(console, state_dir, slow_model):
    # SIGTERM (a pod stopped, an upgrade) drains as a replica leaving does: new requests are refused, those running
    # are answered, within the drain timeout, then the workers stop.
    running = await start_agent(console, state_dir, stop_workers_on_exit=True)
    try:
        pid = await ready(console, slow_model)
        request = asyncio.ensure_future(infer(running.agent, "chat"))
        await until(lambda: running.agent.supervisor.get(7).picked, 30, "the forward to be under way")
        running.agent.request_stop()
        await until(lambda: running.agent.supervisor.get(7).draining, 30, "the replica to drain")
        status, body = await infer(running.agent, "chat")
        assert status == 503 and "draining" in body["error"]
        status, data = await request
        assert status == 200 and set(data) == {pid}
        await asyncio.wait_for(running.task, 30)
        assert not alive(pid)
    finally:
        await running.stop()
