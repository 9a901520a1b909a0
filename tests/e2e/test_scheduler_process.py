"""`manage.py up --scheduler-process`: the scheduler (its election, passes and chores) in a child process, the
links, pages and API in `up`. Simulated agents (bench/fleet_sim.py) linked to `up` get their replicas placed by the
child, whose pushes cross to `up` through the channel layer (one message per pass); the child leads, and it dies
with `up`, even by kill -9. Runs in the PostgreSQL + Redis pass."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from bench.fleet import issue_tokens, write_model
from bench.fleet_sim import SimFleet, SimSpec
from bench.harness import deploy, register, running_stack
from tests.e2e.test_consoles import services_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.db_stack]

HOSTS = 3
DEPLOYMENTS = {"chat": 3, "code": 2}


def _leader_holder(stack) -> str:
    code = "from console.control.leader import current_leader as c; print(c().holder)"
    return stack.manage("shell", "-c", code).splitlines()[-1].strip()


def _setup(stack, tmp_path) -> None:
    with stack.api() as api:
        register(api, "tiny", write_model(tmp_path / "tiny"))
        for name, count in DEPLOYMENTS.items():
            deploy(api, name, "tiny", replicas=count)


async def test_a_scheduler_in_a_child_process_places_the_fleet_and_dies_with_up(tmp_path):
    services_or_skip()
    total = sum(DEPLOYMENTS.values())
    with running_stack(tmp_path / "data", gpus="sim:1x1GiB", args=("--no-agent", "--scheduler-process"),
                       MODELGRID_STRATEGY="balance") as stack:
        children = [p for p in stack.descendants() if "scheduler" in p.cmdline()]
        assert len(children) == 1, [p.cmdline() for p in stack.descendants()]
        scheduler = children[0]
        tokens = await asyncio.to_thread(issue_tokens, stack, HOSTS)
        async with SimFleet(stack.url, tokens, SimSpec(gpus=2, load_s=0.2, report_interval=1.0)) as fleet:
            assert await fleet.wait_for(lambda: fleet.connected() == HOSTS, 30), "the agents did not connect"
            await asyncio.to_thread(_setup, stack, tmp_path)
            settled = await fleet.wait_for(lambda: len(fleet.ready()) == total and fleet.states() == {"ready": total},
                                           60)
            assert settled, f"not settled: {fleet.states()}"
            # Placed over every host: each was pushed by the child through this process's links.
            assert all(agent.replicas for agent in fleet.agents.values())
            assert all(not agent.metrics.errors for agent in fleet.agents.values())
        holder = await asyncio.to_thread(_leader_holder, stack)
        assert holder.endswith(f":{scheduler.pid}"), holder  # the child leads, not `up`
        stack.proc.kill()
        stack.proc.wait(10)
        deadline = time.monotonic() + 10
        while scheduler.is_running() and scheduler.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not scheduler.is_running() or scheduler.status() == psutil.STATUS_ZOMBIE, "it outlived `up`"
