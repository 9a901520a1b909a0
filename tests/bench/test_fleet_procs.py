"""The simulated fleet split over processes (bench/fleet_procs.py): each agent runs in exactly one child, and the
parent sees their links, replica states and metrics together. A small websocket server on loopback stands in for
the console: it gives each host that says hello one replica, and counts the acks."""

import collections

from aiohttp import web

from agent.protocol import Ack, DesiredReplica, DesiredState, Hello, dump, parse_agent_message
from bench.fleet_procs import ProcessFleet
from bench.fleet_sim import GIB, WS_PATH, SimSpec


async def console_stand_in(hosts: collections.Counter, acks: list):
    async def link(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        token = request.headers["Authorization"].removeprefix("Bearer ")
        async for message in ws:
            parsed = parse_agent_message(message.data)
            if isinstance(parsed, Hello):
                hosts[token] += 1
                rid = int(token.removeprefix("token-"))
                replica = DesiredReplica(id=rid, deployment=f"d{rid}", model_path="/m",
                                         architecture="LlamaForCausalLM", gpus=[0], reserved_bytes=GIB)
                await ws.send_str(dump(DesiredState(generation=1, replicas=[replica])))
            elif isinstance(parsed, Ack):
                acks.append((token, parsed.generation))
        return ws

    app = web.Application()
    app.router.add_get(WS_PATH, link)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_agents_are_shared_out_over_the_processes_and_seen_together():
    hosts, acks = collections.Counter(), []
    runner, port = await console_stand_in(hosts, acks)
    tokens = {f"sim-{i}": f"token-{i}" for i in range(1, 6)}
    spec = SimSpec(gpus=1, load_s=0.1, start_s=0.05, report_interval=0.5)
    try:
        async with ProcessFleet(f"http://127.0.0.1:{port}", tokens, spec, processes=2) as fleet:
            assert len(fleet.processes()) == 2
            assert await fleet.wait_for(lambda: fleet.states() == {"ready": 5}, 60), fleet.states()
            assert fleet.connected() == 5 and sorted(fleet.ready()) == [1, 2, 3, 4, 5]
            await fleet.collect()
            assert sorted(fleet.agents) == sorted(tokens)
            assert all([g for g, _, _ in a.metrics.acks] == [1] for a in fleet.agents.values())
            assert fleet.loop_lag  # each child's loop was probed
    finally:
        await runner.cleanup()
    assert sorted(hosts) == sorted(tokens.values()) and set(hosts.values()) == {1}  # each agent ran once
    assert sorted(acks) == sorted((t, 1) for t in tokens.values())


async def test_a_fleet_stops_its_processes_on_exit():
    async with ProcessFleet("http://127.0.0.1:1", {"sim-1": "t1", "sim-2": "t2"}, SimSpec(), processes=2) as fleet:
        children = fleet.processes()
        await fleet.refresh()
        assert fleet.connected() == 0  # nothing listens there: they keep trying
    assert not any(p.is_running() and p.status() != "zombie" for p in children)
