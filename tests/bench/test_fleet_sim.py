"""The fleet simulator speaks the real protocol: a logs_request gets a logs reply that says why it has no lines."""

import asyncio

from agent.protocol import LogsReply, LogsRequest, dump, parse_agent_message
from bench.fleet_sim import SimAgent


async def test_a_simulated_host_answers_a_logs_request_with_an_error_that_says_why():
    sim = SimAgent("http://127.0.0.1:1", "sim-3", "token")
    sim._outbox = asyncio.Queue()  # as while connected
    sim._on_console_message(dump(LogsRequest(request_id="q7", replica_id=12, tail=5)))
    reply = parse_agent_message(sim._outbox.get_nowait())
    assert isinstance(reply, LogsReply) and (reply.request_id, reply.replica_id, reply.lines) == ("q7", 12, [])
    assert "sim-3 is a simulated host" in reply.error and "no worker processes" in reply.error
    assert sim.metrics.acks == [] and sim.metrics.errors == []  # not taken for a desired state or an error
