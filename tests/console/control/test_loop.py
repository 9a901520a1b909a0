import asyncio
import contextlib

import pytest
from channels.db import database_sync_to_async

from console.catalog.services import register_model
from console.control.hub import Hub
from console.control.loop import scheduler_loop
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.fleet.models import Gpu, Host

pytestmark = pytest.mark.django_db(transaction=True)


def setup_fleet_and_model(model_dir):
    host = Host.objects.create(name="h1", connected=True)
    Gpu.objects.create(host=host, index=0, uuid="SIM-0", name="sim", total_bytes=1 << 34, simulated=True)
    register_model("tiny", str(model_dir))


@contextlib.asynccontextmanager
async def scheduler_running(interval: float):
    """The scheduler loop running on this event loop for the block, stopped after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler_loop(stop, interval=interval))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def placed_on_h1() -> None:
    async with asyncio.timeout(10):
        while not await database_sync_to_async(Replica.objects.filter(host__name="h1").exists)():
            await asyncio.sleep(0.05)


async def test_a_new_deployment_wakes_the_loop_instead_of_waiting_for_the_next_tick(model_dir):
    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    async with scheduler_running(interval=60):  # a tick would come far too late
        await asyncio.sleep(0.3)  # the first pass has run; the loop now waits
        await database_sync_to_async(create_deployment)("chat", "tiny")
        await placed_on_h1()


async def test_a_wake_up_from_the_leaders_own_process_needs_no_channel_layer(model_dir, monkeypatch, settings):
    # Redis restarting loses channel-layer messages: a change made in the leader's own process still wakes it.
    from console.control import layer

    lost = []

    async def lossy(group, event, **fields):
        lost.append(event)

    monkeypatch.setattr(layer, "send", lossy)
    settings.MODELGRID_SCHEDULER_RESYNC_SECONDS = 3600
    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    async with scheduler_running(interval=60):
        await asyncio.sleep(0.3)  # the first pass has run; the loop now waits
        await database_sync_to_async(create_deployment)("chat", "tiny")
        await placed_on_h1()
        assert "scheduler.wake" not in lost


async def test_an_agents_report_that_frees_memory_wakes_the_loop(model_dir):
    from agent.protocol import GpuInfo, HostReport
    from console.intake.batcher import batcher
    from console.intake.stages import Item

    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    # Something else fills the GPU: the deployment waits unplaced.
    await database_sync_to_async(Gpu.objects.filter(index=0).update)(used_bytes=1 << 34)
    await database_sync_to_async(create_deployment)("chat", "tiny")
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    async with scheduler_running(interval=60):  # a tick would come far too late
        await asyncio.sleep(0.5)  # the first pass found no room; the loop now waits
        assert not await database_sync_to_async(Replica.objects.filter(host__name="h1").exists)()
        freed = GpuInfo(index=0, uuid="SIM-0", name="sim", total_bytes=1 << 34, used_bytes=0, simulated=True)
        outcome = await batcher().submit(Item(host.pk, host.name, HostReport(gpus=[freed])))
        assert outcome.news
        await placed_on_h1()


async def test_a_push_the_host_never_acknowledged_is_sent_again(model_dir, monkeypatch):
    from console.control import loop as scheduler

    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    sent = []

    async def push(self, host_ids, states=None):
        sent.append(list(host_ids))

    monkeypatch.setattr(Hub, "push_desired", push)
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


class Passes:
    """Every pass the loop runs, as reconcile_once returned it."""

    def __init__(self, monkeypatch) -> None:
        from console.control import loop as scheduler

        self.seen: list = []
        real = scheduler.reconcile_once

        def spy(fence=None, scope="plan"):
            result = real(fence, scope)
            self.seen.append(result)
            return result

        monkeypatch.setattr(scheduler, "reconcile_once", spy)

    async def until(self, predicate, seconds: float = 10) -> None:
        async with asyncio.timeout(seconds):
            while not predicate(self.seen):
                await asyncio.sleep(0.02)


async def test_a_settled_fleet_ticks_until_the_resync_is_due(model_dir, monkeypatch, settings):
    settings.MODELGRID_SCHEDULER_RESYNC_SECONDS = 3600
    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    await database_sync_to_async(create_deployment)("chat", "tiny")
    passes = Passes(monkeypatch)
    async with scheduler_running(interval=0.05):
        await placed_on_h1()
        # Nothing wakes it now and no rule of the plan turns by the clock: the passes that follow plan nothing.
        await passes.until(lambda seen: len(seen) >= 4 and not any(r.planned for r in seen[-3:]))
        settings.MODELGRID_SCHEDULER_RESYNC_SECONDS = 0.2  # ... until the last plan is this old
        count = len(passes.seen)
        await passes.until(lambda seen: any(r.planned for r in seen[count:]))


async def test_a_deployment_goes_idle_on_time_though_nothing_wakes_the_scheduler(model_dir, settings):
    settings.MODELGRID_SCHEDULER_RESYNC_SECONDS = 3600  # only the plan's own next change can bring the pass
    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    await database_sync_to_async(create_deployment)("chat", "tiny", replicas=1, min_replicas=0, max_replicas=1,
                                                    idle_timeout_s=2)
    async with scheduler_running(interval=0.05):
        await placed_on_h1()
        async with asyncio.timeout(10):
            while await database_sync_to_async(Replica.objects.filter(host__name="h1").exists)():
                await asyncio.sleep(0.05)
        replica = await database_sync_to_async(Replica.objects.get)()
        assert "scaled to zero" in replica.reason


async def test_replicas_states_alone_update_their_deployments_without_a_plan(model_dir, monkeypatch, settings):
    from agent.protocol import ReplicaStatus
    from console.deployments.models import Deployment
    from console.intake.batcher import batcher
    from console.intake.stages import Item

    settings.MODELGRID_SCHEDULER_RESYNC_SECONDS = 3600
    settings.MODELGRID_MIN_RESIDENCY_SECONDS = 0  # no time rule turns after the placement
    await database_sync_to_async(setup_fleet_and_model)(model_dir)
    await database_sync_to_async(Gpu.objects.update)(own_bytes=0)  # its agent says what its workers hold
    await database_sync_to_async(create_deployment)("chat", "tiny")
    passes = Passes(monkeypatch)
    async with scheduler_running(interval=60):
        await placed_on_h1()
        await passes.until(lambda seen: seen and not seen[-1].changed)  # settled
        count = len(passes.seen)
        replica = await database_sync_to_async(Replica.objects.get)()
        host = await database_sync_to_async(Host.objects.get)(name="h1")
        outcome = await batcher().submit(Item(host.pk, host.name, ReplicaStatus(replica_id=replica.pk, state="ready",
                                                                                pid=42)))
        assert outcome.observed and not outcome.news
        async with asyncio.timeout(10):
            while (await database_sync_to_async(Deployment.objects.get)(name="chat")).state != "ready":
                await asyncio.sleep(0.05)
        assert passes.seen[count:] and not any(r.planned for r in passes.seen[count:])


def test_a_pass_says_when_the_clock_changes_its_plan_and_whether_traffic_is_seen(model_dir, db):
    from django.utils import timezone

    from console.control.reconcile import reconcile_once

    setup_fleet_and_model(model_dir)
    create_deployment("chat", "tiny", replicas=1, min_replicas=0, max_replicas=1, idle_timeout_s=300)
    first = reconcile_once()
    assert first.planned and not first.busy
    created = Replica.objects.get().deployment.created.timestamp()
    assert first.recheck_at is not None and abs(first.recheck_at - (created + 300)) < 1e-3  # idle from then
    Host.objects.update(serving={"chat": {"request_rate": 2.0, "p95_ms": 40.0}}, last_seen=timezone.now())
    assert reconcile_once().busy  # traffic: its figures move without waking the scheduler
    tick = reconcile_once(scope="tick")
    assert not tick.planned and not tick.changed


def test_the_chores_check_for_leadership_without_waiting_for_a_passs_row_lock(db):
    """A pass holds the epoch's row for its whole transaction; the chores' check reads it without a lock."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from console.control.leader import Elector, NotLeader

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


def test_a_pass_that_only_derived_deployments_states_asks_for_no_other(model_dir, db):
    from console.control.reconcile import reconcile_once

    setup_fleet_and_model(model_dir)
    create_deployment("chat", "tiny")
    assert reconcile_once().replanned  # placed: the next pass sees it through
    for _ in range(3):
        if not reconcile_once().replanned:
            break
    Replica.objects.update(observed_state="ready", pid=42)  # as an agent's report would
    result = reconcile_once()
    assert result.changed and not result.replanned  # the deployment is ready now; its plan is the same


async def test_the_chores_wait_for_the_acks_due_here_then_run(monkeypatch):
    """While a wave of pushes waits for its acks, the leader's chores come after (for a bounded while)."""
    from console.control import hub as hub_module
    from console.control import loop as module

    here = hub_module.hub()

    ran = []

    async def no_webhooks(on_db):
        return 0

    class Link:
        async def desired_push(self, event): ...

    monkeypatch.setattr(module, "_fenced_chores", lambda elector: ran.append(elector))
    monkeypatch.setattr(module, "deliver", no_webhooks)
    monkeypatch.setattr(module, "CHORES_WAIT_SECONDS", 60)
    monkeypatch.setattr(hub_module, "ACK_EXPECTED_SECONDS", 60)
    link, stop = Link(), asyncio.Event()
    here.hold(9, link)
    here.sent(9, 1)
    task = asyncio.create_task(module._chore_loop("the elector", stop))
    try:
        await asyncio.sleep(0.3)
        assert ran == []  # an ack is due
        here.acknowledged(9, 1)
        async with asyncio.timeout(5):
            while not ran:
                await asyncio.sleep(0.01)
        assert ran == ["the elector"]
    finally:
        stop.set()
        here.release(9, link)
        await asyncio.wait_for(task, 5)


async def test_a_pass_counts_as_under_way_until_its_pushes_are_handed_over(monkeypatch):
    """Intake's readings and the chores wait for a pass here (Hub.planning: console/control/hub.py): from before it
    plans until its pushes have gone out, so that nothing starts between its commit and its wave."""
    from console.control import loop as module
    from console.control.hub import hub
    from console.control.reconcile import PassResult

    here = hub()

    seen = []

    def reconcile(fence, scope):
        seen.append(("pass", here.planning_now()))
        return PassResult(changed_hosts=(3,), changed=False, planned=True, states={3: (1, "[]")})

    async def push(self, hosts, states):
        seen.append(("push", here.planning_now()))

    def on_this_loop(fn):  # the pass's thread has no event loop to ask
        async def call(*args):
            return fn(*args)
        return call

    monkeypatch.setattr(module, "database_sync_to_async", on_this_loop)
    monkeypatch.setattr(module, "reconcile_once", reconcile)
    monkeypatch.setattr(Hub, "push_desired", push)
    await module.run_pass()
    assert seen == [("pass", True), ("push", True)] and not here.planning_now()


async def test_a_pass_that_fails_is_no_longer_under_way(monkeypatch):
    from console.control import loop as module
    from console.control.hub import hub
    from console.control.leader import NotLeader

    here = hub()

    def deposed(fence, scope):
        raise NotLeader("another console leads now")

    async def on_this_loop_fn(*args):
        return deposed(*args)

    monkeypatch.setattr(module, "database_sync_to_async", lambda fn: on_this_loop_fn)
    with pytest.raises(NotLeader):
        await module.run_pass()
    assert not here.planning_now()
