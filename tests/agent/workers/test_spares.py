"""Warm spare workers: real spawned processes that import torch before they know their replica."""

import asyncio
import os
import signal

import psutil
import pytest

from agent.workers import spares as spares_module
from agent.workers.demo_models import build_tiny_llama
from agent.workers.spares import spawn_worker
from agent.workers.spec import WorkerSpec
from agent.workers.supervisor import Supervisor
from tests.agent.workers.test_supervisor import IDS, reference_model, until

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_replica_adopts_a_spare_serves_exact_logits_and_the_pool_refills(llama):
    import torch

    events = []
    supervisor = Supervisor(lambda h, progress: progress or events.append((h.spec.replica_id, h.state)), warm_spares=1)
    try:
        supervisor.start_spares()
        (spare,) = supervisor.spares.spares()
        assert supervisor.handles() == [] and events == []  # a spare is no replica and is never reported
        # Adopted at once, while it still imports torch: the spec waits in its pipe.
        handle = supervisor.start(WorkerSpec(1, str(llama), "causal-lm", deployment="chat"))
        assert handle.pid == spare.pid and handle.status().pid == spare.pid
        await until(lambda: handle.state in ("ready", "failed"), 120, "the adopted spare to load")
        assert handle.state == "ready", handle.reason
        assert events == [(1, "starting"), (1, "loading"), (1, "ready")]

        outputs = await handle.infer({"input_ids": IDS})
        with torch.inference_mode():
            expected = reference_model(llama, "AutoModelForCausalLM")(input_ids=torch.from_numpy(IDS)).logits
        assert torch.equal(torch.from_numpy(outputs["logits"]), expected)

        await until(lambda: len(supervisor.spares.spares()) == 1, 10, "the pool to refill")
        (refill,) = supervisor.spares.spares()
        assert refill.pid != spare.pid and psutil.pid_exists(refill.pid)
        assert [h.spec.replica_id for h in supervisor.handles()] == [1]
    finally:
        await supervisor.stop_all()
    assert gone(handle.pid) and gone(refill.pid) and supervisor.spares.spares() == []
    assert all(gone(p.pid) for p in psutil.Process().children(recursive=True) if "agent.workers" in p.cmdline())


async def test_stop_all_leaves_no_spare_even_while_it_imports():
    supervisor = Supervisor(warm_spares=2)
    supervisor.start_spares()
    pids = [s.pid for s in supervisor.spares.spares()]
    assert len(pids) == 2 and all(psutil.pid_exists(pid) for pid in pids)
    await asyncio.sleep(0.3)
    await supervisor.stop_all()
    assert all(gone(pid) for pid in pids) and supervisor.spares.spares() == []
    await asyncio.sleep(0.2)
    assert supervisor.spares.spares() == []  # none started again after the shutdown


async def test_a_spare_that_dies_is_replaced_but_not_for_ever(monkeypatch, caplog):
    monkeypatch.setattr(spares_module, "BACKOFF_S", 0.05)
    supervisor = Supervisor(warm_spares=1)
    supervisor.start_spares()
    killed = []
    try:
        for _ in range(spares_module.MAX_FAILURES):
            await until(lambda: supervisor.spares.spares(), 10, "a spare")
            (spare,) = supervisor.spares.spares()
            os.kill(spare.pid, signal.SIGKILL)
            killed.append(spare.pid)
            await until(lambda s=spare: s not in supervisor.spares.spares(), 10, "the dead spare to be dropped")
        await asyncio.sleep(0.5)
        assert supervisor.spares.spares() == []  # it gave up
        assert "replicas start cold from now on" in caplog.text
    finally:
        await supervisor.stop_all()
    assert all(gone(pid) for pid in killed)


async def test_a_spare_whose_pipe_closes_exits_quietly():
    process, conn = spawn_worker(spare=True)
    conn.close()
    await asyncio.to_thread(process.join, 60)
    assert process.exitcode == 0
