"""The console's HTTP connections are bounded: idle ones past the limit make room for new ones, a request's
headers and body must arrive in time, and websockets are not counted (uvicorn with console.connections)."""

import asyncio
import socket

import httpx
import pytest
import uvicorn

from console.connections import guarded_http
from tests.sockets import closed


async def app(scope, receive, send):
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def server():
    """A uvicorn server on loopback with a limit of 20 connections and short timeouts."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    protocol = guarded_http(limit=20, header_timeout=0.5, body_timeout=0.5)
    config = uvicorn.Config(app, lifespan="off", log_level="error", http=protocol, ws="websockets-sansio")
    instance = uvicorn.Server(config)
    task = asyncio.ensure_future(instance.serve(sockets=[sock]))
    while not instance.started:
        await asyncio.sleep(0.01)
    instance.port = sock.getsockname()[1]
    yield instance
    instance.should_exit = True
    await asyncio.wait_for(task, 10)


async def idle_connections(port: int, count: int) -> list:
    return [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]


async def get(port: int) -> int:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(f"http://127.0.0.1:{port}/")).status_code


async def test_idle_connections_past_the_limit_make_room_for_a_request(server):
    idle = await idle_connections(server.port, 60)  # three times the limit, none sending a byte
    assert await get(server.port) == 200
    assert await closed(idle[0][0])  # the longest waiting went first
    for _, writer in idle:
        writer.close()


async def test_a_connection_that_sends_no_request_or_a_slow_one_is_closed(server):
    (silent, _), (slow, writer) = await idle_connections(server.port, 2)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # headers begun, never finished
    assert await closed(silent) and await closed(slow)


async def test_a_body_that_trickles_past_the_timeout_is_cut(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    assert await closed(reader)


async def test_websockets_are_not_counted_against_the_limit(server):
    import websockets

    links = [await websockets.connect(f"ws://127.0.0.1:{server.port}/") for _ in range(25)]
    assert await get(server.port) == 200
    await links[0].send("still here")  # the links past the limit stay open
    for link in links:
        await link.close()
