import asyncio

import pytest
from channels.db import database_sync_to_async

from console.catalog.services import register_model
from console.deployments.loop import scheduler_loop
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.fleet.models import Gpu, Host

pytestmark = pytest.mark.django_db(transaction=True)


def setup_fleet_and_model(model_dir):
    host = Host.objects.create(name="h1", connected=True)
    Gpu.objects.create(host=host, index=0, uuid="SIM-0", name="sim", total_bytes=1 << 34, simulated=True)
    register_model("tiny", str(model_dir))


async def placed_on_h1() -> None:
    async with asyncio.timeout(10):
        while not await database_sync_to_async(Replica.objects.filter(host__name="h1").exists)():
            await asyncio.sleep(0.05)


async def test_a_new_deployment_wakes_the_loop_instead_of_waiting_for_the_next_tick(model_dir):
    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    stop = asyncio.Event()
    loop = asyncio.create_task(scheduler_loop(stop, interval=60))  # a tick would come far too late
    try:
        await asyncio.sleep(0.3)  # the first pass has run; the loop now waits
        await database_sync_to_async(create_deployment)("chat", "tiny")
        await placed_on_h1()
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)


async def test_an_agents_report_that_frees_memory_wakes_the_loop(model_dir):
    from agent.protocol import GpuInfo, HostReport
    from console.fleet.intake import Item
    from console.realtime.batcher import batcher

    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    # Something else fills the GPU: the deployment waits unplaced.
    await database_sync_to_async(Gpu.objects.filter(index=0).update)(used_bytes=1 << 34)
    await database_sync_to_async(create_deployment)("chat", "tiny")
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    stop = asyncio.Event()
    loop = asyncio.create_task(scheduler_loop(stop, interval=60))  # a tick would come far too late
    try:
        await asyncio.sleep(0.5)  # the first pass found no room; the loop now waits
        assert not await database_sync_to_async(Replica.objects.filter(host__name="h1").exists)()
        freed = GpuInfo(index=0, uuid="SIM-0", name="sim", total_bytes=1 << 34, used_bytes=0, simulated=True)
        outcome = await batcher().submit(Item(host.pk, host.name, HostReport(gpus=[freed])))
        assert outcome.news
        await placed_on_h1()
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)


async def test_a_push_the_host_never_acknowledged_is_sent_again(model_dir, monkeypatch):
    from console.deployments import loop as scheduler

    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    sent = []

    async def push(host_ids, states=None):
        sent.append(list(host_ids))

    monkeypatch.setattr(scheduler, "push_desired", push)
    await scheduler.run_pass()  # the first pass gives every host its desired state
    generation = await database_sync_to_async(lambda: Host.objects.get(pk=host.pk).generation)()
    await database_sync_to_async(Host.objects.filter(pk=host.pk).update)(acked_generation=generation - 1)
    sent.clear()
    pushed: dict[int, float] = {}
    await scheduler.run_pass(pushed=pushed)
    assert sent == []  # behind, but just noticed: its push may still be on its way
    pushed[host.pk] -= scheduler.RESEND_SECONDS  # ... and that long ago
    await scheduler.run_pass(pushed=pushed)
    assert sent == [[host.pk]]  # lost (the channel layer failed it): sent again
    await database_sync_to_async(Host.objects.filter(pk=host.pk).update)(acked_generation=generation)
    await scheduler.run_pass(pushed=pushed)
    assert sent == [[host.pk]] and pushed == {}  # acknowledged: nothing more to repair


def test_the_chores_check_for_leadership_without_waiting_for_a_passs_row_lock(db):
    """A pass holds the epoch's row for its whole transaction; the chores' check reads it without a lock."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from console.deployments.leader import Elector, NotLeader

    elector = Elector()
    assert elector.try_lead()
    try:
        with CaptureQueriesContext(connection) as ctx:
            elector.check()
        assert ctx.captured_queries and not any("FOR UPDATE" in q["sql"] for q in ctx.captured_queries)
        elector.epoch += 1  # as if a successor had taken over
        with pytest.raises(NotLeader, match="superseded"):
            elector.check()
    finally:
        elector.step_down()
