"""The agent's inference server holds a bounded number of connections: past it, the one idle longest makes room
for the new one, and a connection busy with a request is never the one closed (agent.serving.connections)."""

import asyncio

import aiohttp
import pytest
from aiohttp import web

from agent.serving.connections import GuardedRunner
from tests.sockets import closed


@pytest.fixture
async def server():
    release = asyncio.Event()

    async def ok(request):
        return web.Response(text="ok")

    async def slow(request):
        await release.wait()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/", ok)
    app.router.add_get("/slow", slow)
    runner = GuardedRunner(app, limit=10)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    runner.port, runner.release = runner.addresses[0][1], release
    yield runner
    release.set()
    await runner.cleanup()


async def test_idle_connections_past_the_limit_make_room_and_a_busy_one_is_kept(server):
    async with aiohttp.ClientSession() as session:
        busy = asyncio.ensure_future(session.get(f"http://127.0.0.1:{server.port}/slow"))
        await asyncio.sleep(0.2)  # its request is in progress
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(30)]
        async with session.get(f"http://127.0.0.1:{server.port}/") as response:
            assert response.status == 200
        assert await closed(idle[0][0])  # the longest idle went
        server.release.set()
        async with await busy as response:  # the request in progress was not cut
            assert await response.text() == "done"
        for _, writer in idle:
            writer.close()
