"""An agent link's outbox: messages in order, state changes carried by one report built when it is sent."""

import asyncio

import pytest

from agent.protocol import Ack, HostReport, ReplicaStatus, parse_agent_message
from agent.protocol.outbox import Outbox
from agent.protocol.reports import Reporter


class Host:
    """A host's replicas as its agent sees them now; reports are built from this at send time."""

    def __init__(self) -> None:
        self.states: dict[int, str] = {}
        self.reporter = Reporter()
        self.built = 0

    def status(self, rid: int, **extra) -> ReplicaStatus:
        return ReplicaStatus(replica_id=rid, state=self.states[rid], **extra)

    def report(self, gone: list[ReplicaStatus]) -> HostReport:
        self.built += 1
        return self.reporter.report([], [self.status(rid) for rid in self.states], [], None, gone=gone)


async def drain(outbox: Outbox) -> list:
    out = []
    while not outbox.empty():
        out.append(parse_agent_message(await outbox.get()))
        outbox.task_done()
    return out


@pytest.fixture
def host():
    return Host()


async def test_changes_made_while_a_report_waits_ride_in_it_and_the_ack_goes_first(host):
    outbox = Outbox(host.report)
    for rid in range(1, 11):  # an apply that starts ten workers
        host.states[rid] = "starting"
        outbox.changed(host.status(rid))
    outbox.post(Ack(generation=4))
    sent = await drain(outbox)
    assert [type(m) for m in sent] == [Ack, HostReport]
    assert [(s.replica_id, s.state) for s in sent[1].replicas] == [(rid, "starting") for rid in range(1, 11)]
    assert host.built == 1


async def test_a_report_says_what_holds_when_it_is_sent_not_when_it_was_asked_for(host):
    outbox = Outbox(host.report)
    host.states[1] = "starting"
    outbox.changed(host.status(1))
    host.states[1] = "loading"  # before the link got to send it
    outbox.changed(host.status(1))
    (report,) = await drain(outbox)
    assert [(s.replica_id, s.state) for s in report.replicas] == [(1, "loading")]


async def test_a_replica_gone_before_the_report_is_sent_is_reported_with_its_last_status(host):
    outbox = Outbox(host.report)
    host.states.update({1: "ready", 2: "ready"})
    outbox.report()
    await drain(outbox)
    del host.states[2]  # stopped: the agent no longer has it
    outbox.changed(ReplicaStatus(replica_id=2, state="stopped"))
    (report,) = await drain(outbox)
    assert [(s.replica_id, s.state) for s in report.replicas] == [(2, "stopped")]
    outbox.report()
    (later,) = await drain(outbox)
    assert later.replicas == []  # told once


async def test_loading_progress_is_its_own_message_unless_a_waiting_report_will_carry_it(host):
    outbox = Outbox(host.report)
    host.states[1] = "loading"
    outbox.progress(host.status(1, loaded_bytes=10))
    assert [(type(m), m.loaded_bytes) for m in await drain(outbox)] == [(ReplicaStatus, 10)]
    outbox.changed(host.status(1))
    outbox.progress(host.status(1, loaded_bytes=20))
    host.states[1] = "ready"
    # Sent after the report, the progress would tell the console "loading" after the report said "ready".
    sent = await drain(outbox)
    assert [(type(m), [s.state for s in m.replicas]) for m in sent] == [(HostReport, ["ready"])]


async def test_asking_for_a_report_while_one_waits_adds_nothing(host):
    outbox = Outbox(host.report)
    outbox.report()
    outbox.report()
    outbox.post(Ack(generation=1))
    host.states[1] = "loading"
    outbox.changed(host.status(1))  # after the ack was posted: the waiting report, built later, carries it
    sent = await drain(outbox)
    assert [type(m) for m in sent] == [Ack, HostReport]
    assert [(s.replica_id, s.state) for s in sent[1].replicas] == [(1, "loading")]
    assert host.built == 1


async def test_join_waits_until_everything_was_sent(host):
    outbox = Outbox(host.report)
    outbox.report()
    outbox.post(Ack(generation=1))

    async def sender() -> None:
        while True:
            await outbox.get()
            outbox.task_done()

    task = asyncio.create_task(sender())
    await asyncio.wait_for(outbox.join(), 5)
    assert outbox.empty()
    task.cancel()


async def test_acks_go_ahead_of_everything_else_in_the_order_they_were_posted(host):
    outbox = Outbox(host.report)
    host.states[1] = "loading"
    outbox.progress(host.status(1, loaded_bytes=10))  # a status of its own: no report waits
    outbox.post(Ack(generation=1))
    outbox.changed(host.status(1))
    outbox.post(Ack(generation=2))
    sent = await drain(outbox)
    assert [(type(m), getattr(m, "generation", None)) for m in sent] == [
        (Ack, 1), (Ack, 2), (ReplicaStatus, None), (HostReport, None)]
