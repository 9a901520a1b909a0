"""The hub (console/control/hub.py): this process's links, pushes, acks and wake-ups. Whatever waits on it is woken
by the change it waits for, never by a poll."""

import asyncio

import pytest

from console.control import hub as hub_module
from console.control import layer
from console.control.hub import Hub, hub

_sleep = asyncio.sleep  # the test's own: the hub's waits must not call it (no_polls)


class _Link:
    async def desired_push(self, event: dict) -> None: ...


@pytest.fixture
def no_polls(monkeypatch):
    """asyncio.sleep fails while the test runs: a wait that polls (sleep, look again) fails with it."""

    async def polled(*args, **kwargs):
        raise AssertionError("a wait polled (asyncio.sleep) instead of waiting for the change")

    monkeypatch.setattr(asyncio, "sleep", polled)


async def _turns(n: int = 3) -> None:
    """Let the loop run its ready callbacks `n` times over: a waiter woken by an event has run by then."""
    for _ in range(n):
        await _sleep(0)


def test_there_is_one_hub_per_event_loop():
    async def twice() -> tuple[Hub, Hub]:
        return hub(), hub()

    first, again = asyncio.run(twice())
    assert first is again
    assert asyncio.run(twice())[0] is not first  # another loop (another test): a hub of its own


async def test_a_waiter_for_the_acks_is_woken_by_the_ack_itself(no_polls, monkeypatch):
    monkeypatch.setattr(hub_module, "ACK_EXPECTED_SECONDS", 60)
    here, link = hub(), _Link()
    here.hold(1, link)
    here.hold(2, link)
    try:
        here.sent(1, 3)
        here.sent(2, 3)
        waiter = asyncio.create_task(here.after_acks(0.0, float("inf")))
        await _turns()
        assert not waiter.done()
        here.acknowledged(2, 3)  # the newest: the older one is still due
        await _turns()
        assert not waiter.done()
        here.acknowledged(1, 3)
        await _turns()
        assert waiter.done() and here.acks_due() == 0
    finally:
        here.release(1, link)
        here.release(2, link)


async def test_a_waiter_for_a_pass_is_woken_by_its_end(no_polls):
    here = hub()
    with here.planning():
        waiter = asyncio.create_task(here.after_acks(0.0, 0.0))
        await _turns()
        assert not waiter.done()
    await _turns()
    assert waiter.done()


async def test_a_link_that_ends_answers_its_due_push(no_polls, monkeypatch):
    monkeypatch.setattr(hub_module, "ACK_EXPECTED_SECONDS", 60)
    here, link = hub(), _Link()
    here.hold(5, link)
    here.sent(5, 1)
    waiter = asyncio.create_task(here.after_acks(0.0, float("inf")))
    await _turns()
    assert not waiter.done()
    here.release(5, link)
    await _turns()
    assert waiter.done()


async def test_a_wake_up_reaches_the_scheduler_leading_here_directly(monkeypatch):
    async def lost(group, event, **fields):
        raise AssertionError("sent through the channel layer")

    monkeypatch.setattr(layer, "send", lost)
    woken = []
    with hub().waking_here(woken.append):
        await hub().wake_scheduler()
        await hub().wake_scheduler(states=True)
    assert woken == [False, True]


async def test_pushes_for_links_held_elsewhere_go_out_as_one_message_naming_the_hosts(monkeypatch):
    """One channel-layer message per pass, not one per host: a thousand per-host messages through Redis reached the
    last agent tens of seconds after the pass committed when the scheduler ran in a process of its own."""
    sent = []

    async def send(group, event, **fields):
        sent.append((group, event, fields))

    monkeypatch.setattr(layer, "send", send)
    # Hosts with a state the pass built, and hosts to be sent theirs again (not acknowledged: a resend).
    await hub().push_desired(range(100), {h: (1, []) for h in range(0, 100, 2)})
    assert sent == [(layer.PUSH_GROUP, "desired.pushes", {"hosts": list(range(0, 100, 2)),
                                                          "again": list(range(1, 100, 2))})]
    sent.clear()
    await hub().push_desired([])
    assert sent == []
