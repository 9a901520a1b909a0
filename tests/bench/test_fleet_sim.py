"""The fleet simulator speaks the real protocol: it answers logs requests, and a desired state's changes reach the
console in one report ahead of the ack, as the real agent sends them (agent.protocol.outbox)."""

import dataclasses
import gc

import aiohttp
import pytest

from agent.protocol import (
    Ack,
    DesiredReplica,
    DesiredState,
    HostReport,
    LogsReply,
    LogsRequest,
    dump,
    parse_agent_message,
)
from bench.fleet_sim import GIB, SimAgent, SimSpec
from bench.sim_loop import collector_paused


async def sent(sim: SimAgent) -> list:
    out = []
    while not sim._outbox.empty():
        out.append(parse_agent_message(await sim._outbox.get()))
    return out


async def test_a_simulated_host_answers_a_logs_request_with_an_error_that_says_why():
    sim = SimAgent("http://127.0.0.1:1", "sim-3", "token")
    sim._link_up()  # as while connected
    sim._on_console_message(dump(LogsRequest(request_id="q7", replica_id=12, tail=5)))
    (reply,) = await sent(sim)
    assert isinstance(reply, LogsReply) and (reply.request_id, reply.replica_id, reply.lines) == ("q7", 12, [])
    assert "sim-3 is a simulated host" in reply.error and "no worker processes" in reply.error
    assert sim.metrics.acks == [] and sim.metrics.errors == []  # not taken for a desired state or an error


async def test_the_workers_a_desired_state_starts_are_reported_together_after_its_ack():
    sim = SimAgent("http://127.0.0.1:1", "sim-4", "token")
    sim._link_up()
    replicas = [DesiredReplica(id=rid, deployment=f"d{rid}", model_path="/m", architecture="LlamaForCausalLM",
                               gpus=[rid % 8], reserved_bytes=GIB) for rid in range(1, 11)]
    sim._on_console_message(dump(DesiredState(generation=3, replicas=replicas)))
    messages = await sent(sim)
    assert [type(m) for m in messages] == [Ack, HostReport]
    assert sorted((s.replica_id, s.state) for s in messages[1].replicas) == [(rid, "starting") for rid in range(1, 11)]
    sim._stop(sim.replicas[4], leaving=True)
    (report,) = await sent(sim)
    assert [(s.replica_id, s.state) for s in report.replicas] == [(4, "stopped")]
    for replica in sim.replicas.values():
        sim._cancel(replica)


async def test_readings_and_statuses_kept_between_reports_follow_every_change():
    # The simulator keeps each GPU's reading and each replica's status until what it says changes (a thousand
    # agents share one loop): a kept one must never be stale.
    sim = SimAgent("http://127.0.0.1:1", "sim-5", "token")
    sim._link_up()
    replicas = [DesiredReplica(id=rid, deployment=f"d{rid}", model_path="/m", architecture="LlamaForCausalLM",
                               gpus=[rid], reserved_bytes=rid * GIB) for rid in (1, 2)]
    sim._on_console_message(dump(DesiredState(generation=1, replicas=replicas)))
    await sent(sim)
    assert [g.used_bytes for g in sim.gpus()][:3] == [0, GIB, 2 * GIB]
    one = sim.replicas[1]
    assert sim._status(one).state == "starting" and sim._status(one).measured_bytes is None
    sim._become(one, "ready")
    ready = sim._status(one)
    assert (ready.state, ready.measured_bytes, ready.measurement.weights_bytes) == ("ready", GIB, GIB)
    assert [g.used_bytes for g in sim.gpus()][:3] == [0, GIB, 2 * GIB]
    sim._stop(sim.replicas[2], leaving=True)
    assert [g.used_bytes for g in sim.gpus()][:3] == [0, GIB, 0]
    (report,) = await sent(sim)
    assert {s.replica_id: s.state for s in report.replicas} == {1: "ready", 2: "stopped"}
    assert {g.index: g.used_bytes for g in report.gpus} == {2: 0}  # only the GPU whose reading changed
    for replica in sim.replicas.values():
        sim._cancel(replica)
    sim.spec = dataclasses.replace(sim.spec, gpus=2)  # as tests/e2e/test_chaos_fleet.py gives hosts other GPUs
    assert [g.used_bytes for g in sim.gpus()] == [0, GIB]


async def test_a_busy_host_sends_every_report_whole_with_moving_readings_and_serving_figures():
    sim = SimAgent("http://127.0.0.1:1", "sim-6", "token", dataclasses.replace(SimSpec(), busy=True))
    sim._link_up()
    replica = DesiredReplica(id=1, deployment="d1", model_path="/m", architecture="LlamaForCausalLM", gpus=[0],
                             reserved_bytes=GIB)
    sim._on_console_message(dump(DesiredState(generation=1, replicas=[replica])))
    sim._become(sim.replicas[1], "ready")
    first, second = sim._report(), sim._report()
    for report in (first, second):
        assert len(report.gpus) == 8 and [s.replica_id for s in report.replicas] == [1]
        assert [s.deployment for s in report.serving] == ["d1"]
        assert report.gpus[0].used_bytes == report.gpus[0].own_bytes > GIB  # the KV cache on top of the weights
    assert [g.utilization for g in first.gpus] != [g.utilization for g in second.gpus]
    for r in sim.replicas.values():
        sim._cancel(r)


class _Link:
    """A websocket as _converse reads and writes it: the console's messages in turn, and what the agent sent, by
    the time it asked for each next message."""

    def __init__(self, messages: list[str]) -> None:
        self.inbox = [aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, text, None) for text in messages]
        self.sent: list[str] = []
        self.sent_before_read: list[list[str]] = []

    def __aiter__(self):
        return self

    async def __anext__(self):
        self.sent_before_read.append([parse_agent_message(text).type for text in self.sent])
        if not self.inbox:
            raise StopAsyncIteration
        return self.inbox.pop(0)

    async def send_str(self, text: str) -> None:
        self.sent.append(text)


async def test_an_ack_is_sent_before_the_next_console_message_is_read():
    # A thousand simulated agents share one loop: left to each agent's send loop, an ack waited for every other
    # agent's apply of that turn of the loop. The agent that applies a desired state sends its ack itself.
    sim = SimAgent("http://127.0.0.1:1", "sim-6", "token")
    sim._link_up()
    replicas = [DesiredReplica(id=rid, deployment=f"d{rid}", model_path="/m", architecture="LlamaForCausalLM",
                               gpus=[0], reserved_bytes=GIB) for rid in (1, 2)]
    link = _Link([dump(DesiredState(generation=1, replicas=replicas[:1])),
                  dump(LogsRequest(request_id="q1", replica_id=1)),
                  dump(DesiredState(generation=2, replicas=replicas))])
    await sim._converse(link)
    # Each ack before the next read; a logs reply (not an ack) and the reports are left to the send loop.
    assert link.sent_before_read == [[], ["ack"], ["ack"], ["ack", "ack"]]
    for replica in sim.replicas.values():
        sim._cancel(replica)


async def test_the_collector_is_paused_while_a_fleet_is_measured_and_restored_after():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        async with collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("a measurement failed")
    assert gc.isenabled()
    gc.disable()  # as some callers run
    try:
        async with collector_paused():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()
