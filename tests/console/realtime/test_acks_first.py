"""Acks before readings: while a scheduler pass runs in this process, and then while the pushes it sent wait for their
acks, a batch's readings (replicas' states, GPU readings) hold back, for a bounded while, so that the event loop
sending the pushes and reading the acks does not share the interpreter with intake's largest stage meanwhile
(console/intake/batcher.py)."""

import asyncio
import json
import time

import pytest

from agent.protocol import Ack, HostReport
from console.control import hub as hub_module
from console.control.hub import hub
from console.fleet.models import AgentCredential
from console.intake import batcher as module
from console.intake import stages as intake
from console.intake.batcher import Batcher

from .agent_link import linked


class _Link:
    async def desired_push(self, event: dict) -> None: ...


async def test_a_push_is_due_until_an_ack_covers_it_or_its_link_ends():
    one, two = _Link(), _Link()
    hub().hold(1, one)
    hub().hold(2, two)
    try:
        hub().sent(1, 5)
        hub().sent(2, 3)
        assert hub().acks_due() == 2
        hub().acknowledged(1, 4)  # an older generation's ack: generation 5 is still due
        assert hub().acks_due() == 2
        hub().acknowledged(1, 6)  # a newer one covers it
        assert hub().acks_due() == 1
        hub().release(2, _Link())  # not host 2's link here: its push stays due
        assert hub().acks_due() == 1
        hub().release(2, two)
        assert hub().acks_due() == 0
    finally:
        hub().release(1, one)
        hub().release(2, two)


async def test_a_push_long_unanswered_is_no_longer_due(monkeypatch):
    """An agent that hung (or an ack lost) must not hold every later batch's readings back: the resend repairs it."""
    link = _Link()
    hub().hold(1, link)
    try:
        monkeypatch.setattr(hub_module, "ACK_EXPECTED_SECONDS", 0.05)
        hub().sent(1, 1)
        assert hub().acks_due() == 1
        await asyncio.sleep(0.1)
        assert hub().acks_due() == 0
        hub().sent(2, 1)
        await asyncio.sleep(0.1)
        hub().sent(1, 2)  # sent again, after host 2's went stale: due, though host 1 was first sent before it
        assert hub().acks_due() == 1
        assert await asyncio.wait_for(hub().after_acks(0.0, float("inf")), 5) is None  # waits until it goes stale
    finally:
        hub().release(1, link)
        hub().release(2, link)


@pytest.fixture
def stages(monkeypatch):
    log = []
    monkeypatch.setattr(intake, "apply_hosts", lambda items, leases=None: (
        log.append(("hosts", [i.message.type for i in items])) or intake.Staged([intake.Outcome() for _ in items])))
    monkeypatch.setattr(intake, "apply_readings", lambda items, staged: (
        log.append(("readings", [i.message.type for i in items])) or staged.outcomes))
    monkeypatch.setattr(module, "own_thread", lambda fn, executor=None: lambda *a: asyncio.to_thread(fn, *a))
    return log


async def test_readings_wait_for_the_acks_due_and_go_when_they_come(stages, monkeypatch):
    monkeypatch.setattr(module, "READINGS_WAIT_SECONDS", 30)
    link = _Link()
    hub().hold(7, link)
    try:
        hub().sent(7, 2)
        b = Batcher(tick=0.01, quiet_tick=0.01)
        report = b.enqueue(intake.Item(1, "a", HostReport(gpus=[])))
        await asyncio.sleep(0.3)
        assert stages == [("hosts", ["report"])] and not report.done()  # its readings hold back
        ack = b.enqueue(intake.Item(7, "g", Ack(generation=2)))  # the ack's own batch is not held back
        async with asyncio.timeout(5):
            while ("hosts", ["ack"]) not in stages:
                await asyncio.sleep(0.01)
        assert not report.done()
        hub().acknowledged(7, 2)  # as the link does when it reads the ack
        async with asyncio.timeout(5):
            await asyncio.gather(report, ack)
        # The readings of both batches, applied together once the wait ends, in order.
        assert stages == [("hosts", ["report"]), ("hosts", ["ack"]), ("readings", ["report", "ack"])]
    finally:
        hub().release(7, link)


async def test_readings_wait_no_longer_than_their_bound(stages, monkeypatch):
    monkeypatch.setattr(module, "READINGS_WAIT_SECONDS", 0.2)
    link = _Link()
    hub().hold(7, link)
    try:
        hub().sent(7, 2)  # never acknowledged
        report = Batcher(tick=0.01, quiet_tick=0.01).enqueue(intake.Item(1, "a", HostReport(gpus=[])))
        async with asyncio.timeout(5):
            await report
        assert stages == [("hosts", ["report"]), ("readings", ["report"])]
        assert hub().acks_due() == 1
    finally:
        hub().release(7, link)


@pytest.mark.django_db(transaction=True)
async def test_a_link_counts_its_push_due_until_its_agent_acks_it(monkeypatch):
    from channels.db import database_sync_to_async

    monkeypatch.setattr(hub_module, "ACK_EXPECTED_SECONDS", 60)  # due until the ack, however slow this machine
    token = (await database_sync_to_async(AgentCredential.issue)("h1"))[1]
    comm = await linked(token)  # the hello was answered with a push
    try:
        assert hub().acks_due() == 1
        await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 0}))
        async with asyncio.timeout(5):
            while hub().acks_due():
                await asyncio.sleep(0.01)
    finally:
        await comm.disconnect()
    assert hub().acks_due() == 0


async def test_readings_wait_while_a_pass_is_under_way_past_their_own_bound(stages, monkeypatch):
    """A pass's commit sends its wave: readings started meanwhile (and blocked on the replica rows it holds) ran
    into that wave the moment it committed. They wait for the pass, past their own bound for the acks."""
    monkeypatch.setattr(module, "READINGS_WAIT_SECONDS", 0.1)
    with hub().planning():
        report = Batcher(tick=0.01, quiet_tick=0.01).enqueue(intake.Item(1, "a", HostReport(gpus=[])))
        async with asyncio.timeout(5):
            while not stages:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert stages == [("hosts", ["report"])] and not report.done()
    async with asyncio.timeout(5):
        await report
    assert stages == [("hosts", ["report"]), ("readings", ["report"])]


async def test_a_pass_is_waited_for_no_longer_than_its_bound(stages, monkeypatch):
    """A pass whose pushes cannot be handed over (an agent that stopped reading) must not hold the readings with it."""
    monkeypatch.setattr(hub_module, "PASS_WAIT_SECONDS", 0.2)
    with hub().planning():
        report = Batcher(tick=0.01, quiet_tick=0.01).enqueue(intake.Item(1, "a", HostReport(gpus=[])))
        async with asyncio.timeout(5):
            await report
        assert stages == [("hosts", ["report"]), ("readings", ["report"])]


async def test_after_a_pass_the_readings_bound_counts_from_its_end(stages, monkeypatch):
    """The acks the pass's pushes made due are waited for as long as after any push: the bound counts from when the
    pass ended, not from when the batch's hosts stage was done (seconds before, through a long pass)."""
    monkeypatch.setattr(module, "READINGS_WAIT_SECONDS", 1.0)
    monkeypatch.setattr(hub_module, "ACK_EXPECTED_SECONDS", 60)
    link = _Link()
    hub().hold(7, link)
    try:
        with hub().planning():
            report = Batcher(tick=0.01, quiet_tick=0.01).enqueue(intake.Item(1, "a", HostReport(gpus=[])))
            await asyncio.sleep(1.2)  # longer than the bound
            hub().sent(7, 2)  # the pass's push
        await asyncio.sleep(0.3)
        assert not report.done()
        async with asyncio.timeout(5):
            await report  # the bound, from the pass's end: the ack never came
        assert hub().acks_due() == 1
    finally:
        hub().release(7, link)


async def test_a_pass_that_pushed_nothing_leaves_the_acks_bound_where_it_was(monkeypatch):
    monkeypatch.setattr(hub_module, "ACK_EXPECTED_SECONDS", 60)
    link = _Link()
    hub().hold(7, link)
    try:
        with hub().planning():
            hub().sent(7, 2)
        with hub().planning():
            pass  # a tick: nothing pushed
        since = time.monotonic() - 10  # long past the bound below
        waiting = asyncio.create_task(hub().after_acks(since, 0.5))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # 0.5 s from the end of the pass that pushed
        async with asyncio.timeout(5):
            await waiting
        with hub().planning():
            pass
        async with asyncio.timeout(0.2):  # the bound has passed, from the last pass that pushed
            await hub().after_acks(since, 0.5)
    finally:
        hub().release(7, link)


async def test_only_the_passes_under_way_when_the_wait_began_are_waited_for():
    with hub().planning():
        waiting = asyncio.create_task(hub().after_acks(time.monotonic(), 0.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
    with hub().planning():  # the next pass, back to back: not waited for
        async with asyncio.timeout(2):
            await waiting


async def test_a_pass_ends_on_error_and_counts_on_its_own_event_loop_only():
    async def elsewhere() -> bool:
        return hub().planning_now()

    assert not hub().planning_now()
    with pytest.raises(RuntimeError), hub().planning():
        assert hub().planning_now()
        assert not await asyncio.to_thread(asyncio.run, elsewhere())
        raise RuntimeError("the pass failed")
    assert not hub().planning_now()
