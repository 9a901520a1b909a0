"""A replica's record follows its link's events, applied by the supervisor in order (no torch: the worker is
a fake process whose pipe end the test writes typed messages into)."""

import asyncio
import multiprocessing
import os

import numpy as np
import pytest

from agent.workers import link as link_module
from agent.workers.messages import Command, Failed, Load, Loading, Progress, Ready
from agent.workers.spec import WorkerSpec
from agent.workers.supervisor import Supervisor, WorkerUnavailable

MEASUREMENT = {"device": "cpu", "batch": 1, "seq": 8, "weights_bytes": 100, "peak_bytes": 150, "total_bytes": 150}


class FakeProcess:
    """A worker process as the link sees it: a pid, a sentinel that turns readable at exit, an exit code."""

    def __init__(self, worker_end):
        self.pid = 4242
        self.exitcode = None
        self.sentinel, self._alive = os.pipe()
        self._worker_end = worker_end

    def exit(self, code: int) -> None:
        if self.exitcode is None:
            self.exitcode = code
            self._worker_end.close()  # the agent's end reads EOF, as when a real worker dies
            os.close(self._alive)

    def terminate(self):
        self.exit(-15)

    def kill(self):
        self.exit(-9)

    def join(self, timeout=None):
        pass

    def close(self):
        os.close(self.sentinel)


@pytest.fixture
def workers(monkeypatch):
    """Spawns fake workers; yields the list of (process, the worker's pipe end)."""
    spawned = []

    def spawn(spare=False):
        agent_end, worker_end = multiprocessing.Pipe()
        process = FakeProcess(worker_end)
        spawned.append((process, worker_end))
        return process, agent_end

    monkeypatch.setattr(link_module, "spawn_worker", spawn)
    return spawned


async def until(predicate, what: str):
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"timed out waiting for {what}")


async def test_each_lifecycle_change_is_heard_in_order_with_the_figures_of_its_moment(workers):
    heard = []
    supervisor = Supervisor(lambda h, progress: heard.append((progress, h.state, h.loaded_bytes, h.total_bytes)),
                            heartbeat_timeout=0)
    try:
        handle = supervisor.start(WorkerSpec(1, "/models/tiny", "causal-lm"))
        assert heard == [(False, "starting", None, None)]  # heard before start() returned
        _, worker = workers[0]
        # All three arrive before the agent's loop runs: none of them may be lost to a later one.
        worker.send(Loading("/models/tiny", "cpu", 4242, 1000))
        worker.send(Progress(500, 1000))
        worker.send(Ready(MEASUREMENT, {"output_dim": 32}))
        await until(lambda: handle.state == "ready", "the replica to turn ready")
        assert heard[1:] == [(False, "loading", 0, 1000), (True, "loading", 500, 1000), (False, "ready", 1000, 1000)]
        assert handle.measured_bytes == 150 and handle.info == {"output_dim": 32, "load_seconds": None}
    finally:
        await supervisor.stop_all()
    assert heard[-1][1] == "stopped" and handle.state == "stopped"


async def test_a_request_failed_by_the_workers_death_finds_the_replica_already_failed(workers):
    heard = []
    supervisor = Supervisor(lambda h, progress: heard.append((h.state, h.reason)), heartbeat_timeout=0)
    try:
        handle = supervisor.start(WorkerSpec(2, "/models/tiny", "causal-lm"))
        process, worker = workers[0]
        load = worker.recv()  # a worker's first message: its replica
        assert isinstance(load, Load) and load.spec.replica_id == 2 and load.attach is None
        worker.send(Ready(MEASUREMENT))
        await until(lambda: handle.state == "ready", "the replica to turn ready")
        request = asyncio.ensure_future(handle.infer({"input_ids": np.ones((1, 3), np.int64)}))
        await until(lambda: worker.poll(), "the command to reach the worker")
        sent = worker.recv()
        assert isinstance(sent, Command) and (sent.kind, sent.request_id) == ("infer", 1)
        assert handle.queued == 1
        process.kill()
        with pytest.raises(WorkerUnavailable, match="replica 2: worker process was killed by signal SIGKILL"):
            await request
        # No polling here: the exit was applied before the request's caller ran again.
        assert handle.state == "failed" and handle.reason == "worker process was killed by signal SIGKILL while serving"
        assert heard[-1] == ("failed", handle.reason) and handle.queued == 0 and handle.exitcode == -9
    finally:
        await supervisor.stop_all()


async def test_a_failed_load_is_the_reason_and_the_exit_after_it_changes_nothing(workers):
    heard = []
    supervisor = Supervisor(lambda h, progress: heard.append((h.state, h.reason)), heartbeat_timeout=0)
    try:
        handle = supervisor.start(WorkerSpec(3, "/models/broken", "causal-lm"))
        process, worker = workers[0]
        worker.send(Failed("SafetensorError: model.safetensors is cut short"))
        process.exit(1)
        await until(lambda: handle.exitcode == 1, "the worker's exit to be seen")
        supervisor.settle()
        assert heard == [("starting", ""), ("failed", "SafetensorError: model.safetensors is cut short")]
    finally:
        await supervisor.stop_all()
