"""The intake batcher: a quiet report (a lease renewal, readings) may wait for the quiet tick; anything else brings
its batch forward to the tick, and the quiet ones waiting go with it, in order."""

import asyncio

import pytest
from django.db import connection

from agent.protocol import Ack, HostReport
from console.intake import stages as intake
from console.intake.batcher import Batcher, quiet

QUIET = HostReport(gpus=[], replicas=[], serving=None, ram_free_bytes=None)


def test_a_report_that_tells_no_replicas_state_is_quiet():
    from agent.protocol import DeploymentServing, GpuInfo, ReplicaStatus

    assert quiet(QUIET)
    assert quiet(HostReport(gpus=[]))  # serving [] and a None sleep room: says the host serves nothing
    busy = GpuInfo(index=0, uuid="u", name="g", total_bytes=8, used_bytes=5, own_bytes=5, utilization=70,
                   simulated=True)
    serving = [DeploymentServing(deployment="d", requests=9, request_rate=3.0, error_rate=0.0)]
    assert quiet(HostReport(gpus=[busy], serving=serving, ram_free_bytes=1))  # a busy host's readings move each time
    assert not quiet(HostReport(gpus=[], replicas=[ReplicaStatus(replica_id=1, state="ready")]))
    assert not quiet(Ack(generation=1))


@pytest.fixture
def applied(monkeypatch):
    batches = []

    def apply(items, leases=None):
        batches.append([type(item.message).__name__ for item in items])
        return intake.Staged([intake.Outcome() for _ in items])

    monkeypatch.setattr(intake, "apply_hosts", apply)
    return batches


@pytest.mark.django_db(transaction=True)
async def test_a_quiet_report_waits_for_the_quiet_tick_unless_something_else_comes(applied):
    batcher = Batcher(tick=0.02, quiet_tick=30)
    first = batcher.enqueue(intake.Item(1, "a", QUIET))
    await asyncio.sleep(0.3)
    assert applied == [] and not first.done()  # still waiting: it only renews a lease
    ack = batcher.enqueue(intake.Item(2, "b", Ack(generation=1)))
    async with asyncio.timeout(5):  # far sooner than the quiet tick
        await asyncio.gather(first, ack)
    assert applied == [["HostReport", "Ack"]]  # together, in arrival order

    from agent.protocol import ReplicaStatus

    status = HostReport(gpus=[], replicas=[ReplicaStatus(replica_id=1, state="ready")])
    alone = batcher.enqueue(intake.Item(1, "a", status))  # not quiet: a replica's state, at the short tick
    async with asyncio.timeout(5):
        await alone
    assert applied[-1] == ["HostReport"]


async def test_the_next_ticks_hosts_stage_does_not_wait_for_the_last_ticks_replica_states(monkeypatch):
    """An ack in a later tick is committed while an earlier tick's replica states are still being applied; the
    replica stages keep their order, and every message gets its outcome once its own tick's replicas are done."""
    import threading

    from console.intake import batcher as module

    held = threading.Event()
    log = []

    def hosts(items, leases=None):
        log.append(("hosts", [item.message.type for item in items]))
        return intake.Staged([None] * len(items))

    def replicas(items, staged):
        if items[0].message.type == "report":
            held.wait(10)  # the first tick's replica states take long
        log.append(("replicas", [item.message.type for item in items]))
        return [intake.Outcome() for _ in items]

    monkeypatch.setattr(intake, "apply_hosts", hosts)
    monkeypatch.setattr(intake, "apply_readings", replicas)
    monkeypatch.setattr(module, "own_thread", lambda fn, executor=None: lambda *a: asyncio.to_thread(fn, *a))
    b = Batcher(tick=0.01, quiet_tick=0.01)
    report = b.enqueue(intake.Item(1, "a", HostReport(gpus=[])))
    await asyncio.sleep(0.2)
    ack = b.enqueue(intake.Item(2, "b", Ack(generation=1)))
    async with asyncio.timeout(5):
        while ("hosts", ["ack"]) not in log:
            await asyncio.sleep(0.01)
    assert not report.done() and not ack.done()  # the ack's hosts stage ran; its replicas wait their turn
    held.set()
    async with asyncio.timeout(5):
        await asyncio.gather(report, ack)
    assert log == [("hosts", ["report"]), ("hosts", ["ack"]), ("replicas", ["report"]), ("replicas", ["ack"])]


async def test_an_ack_that_came_during_a_batch_is_applied_next_without_waiting_for_the_event_loop(monkeypatch):
    """The hosts stage's thread goes on to the next batch that is due when it commits one, instead of handing back
    to the event loop and waiting to be handed the next: in a 1,000-host wave the loop, one of many threads wanting
    the interpreter, took ~100 ms and up to 1.5 s to do that (a throwaway trace; docs/benchmarks.md)."""
    import threading
    import time

    from console.intake import batcher as module

    first_running = threading.Event()
    started: list[tuple[str, float]] = []

    def hosts(items, leases=None):
        started.append((items[0].host_name, time.monotonic()))
        if items[0].host_name == "a":
            first_running.set()
            time.sleep(0.3)  # the first batch takes a while
        return intake.Staged([intake.Outcome() for _ in items])

    monkeypatch.setattr(intake, "apply_hosts", hosts)
    monkeypatch.setattr(intake, "apply_readings", lambda items, staged: staged.outcomes)
    monkeypatch.setattr(module, "own_thread", lambda fn, executor=None: lambda *a: asyncio.to_thread(fn, *a))
    b = Batcher(tick=30, quiet_tick=30)
    first = b.enqueue(intake.Item(1, "a", Ack(generation=1)))
    async with asyncio.timeout(5):
        while not first_running.is_set():
            await asyncio.sleep(0.01)
    second = b.enqueue(intake.Item(2, "b", Ack(generation=1)))  # comes while the first batch is applied
    time.sleep(1.0)  # the event loop is busy (blocked here) meanwhile
    busy_until = time.monotonic()
    async with asyncio.timeout(5):
        await asyncio.gather(first, second)
    assert [name for name, _ in started] == ["a", "b"]
    assert started[1][1] < busy_until  # applied while the loop could not have handed it over


async def test_a_hosts_stage_that_cannot_even_start_fails_its_batch_and_the_next_is_tried(monkeypatch):
    from console.intake import batcher as module

    calls = []

    def broken(fn, executor=None):
        async def call(*args):
            calls.append(fn)
            if len(calls) == 1:
                raise RuntimeError("no thread to run on")
            return await asyncio.to_thread(fn, *args)
        return call

    monkeypatch.setattr(intake, "apply_hosts", lambda items, leases: intake.Staged([intake.Outcome() for _ in items]))
    monkeypatch.setattr(intake, "apply_readings", lambda items, staged: staged.outcomes)
    monkeypatch.setattr(module, "own_thread", broken)
    b = Batcher(tick=30, quiet_tick=30)
    async with asyncio.timeout(5):
        failed = await b.enqueue(intake.Item(1, "a", Ack(generation=1)))
        assert failed.error == "the console could not apply this ack (RuntimeError); its log has the details"
        assert (await b.enqueue(intake.Item(1, "a", Ack(generation=2)))).error is None


@pytest.mark.django_db(transaction=True)
async def test_an_ack_is_applied_at_once_and_takes_what_waits_with_it(applied):
    """A push's sender waits for the ack, so it does not wait for a tick: its batch is due as it comes (what
    arrives while a batch is being applied gathers for the next anyway), in arrival order."""
    batcher = Batcher(tick=30, quiet_tick=30)
    report = batcher.enqueue(intake.Item(1, "a", HostReport(gpus=[])))
    await asyncio.sleep(0.2)
    assert applied == [] and not report.done()  # a report waits for its tick
    ack = batcher.enqueue(intake.Item(1, "a", Ack(generation=1)))
    async with asyncio.timeout(5):  # far sooner than either tick
        await asyncio.gather(report, ack)
    assert applied == [["HostReport", "Ack"]]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: on SQLite every database "
                    "call shares Channels' one thread, never the loop's default ones (runs in the PostgreSQL + Redis "
                    "pass)")
@pytest.mark.django_db(transaction=True)
async def test_an_ack_does_not_queue_behind_other_work_on_the_event_loops_threads(applied):
    """On PostgreSQL database work runs off the event loop, most of it on the loop's default threads (chores, the
    gateway's fleet snapshot, links' reads). Intake's stages have threads of their own: an ack queued behind those
    waited 0.5-1 s for a thread during a 1,000-host wave (docs/benchmarks.md). Here every default thread is held."""
    import threading

    loop = asyncio.get_running_loop()
    release = threading.Event()
    held = [loop.run_in_executor(None, release.wait, 10) for _ in range(40)]  # more than the pool has threads
    try:
        ack = Batcher(tick=30, quiet_tick=30).enqueue(intake.Item(1, "a", Ack(generation=1)))
        async with asyncio.timeout(5):
            await ack
        assert applied == [["Ack"]]
    finally:
        release.set()
        await asyncio.gather(*held)
