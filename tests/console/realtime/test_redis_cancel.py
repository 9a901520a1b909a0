"""A cancelled Redis channel-layer call ends. redis-py writes a command under asyncio.wait_for, which on
Python 3.11 drops a cancellation that lands as the write completes; a consumer's cancelled receive() then
kept popping forever, and the gateway's close() (and a websocket's teardown) waited for it forever."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from redis.asyncio.connection import Connection

from console.realtime.redis_connection import CancellableConnection

pytestmark = [pytest.mark.db_stack,
              pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (the PostgreSQL + Redis pass)")]


async def _cancel_as_written(conn: Connection, *command) -> asyncio.Task:
    """Send `command` on a real connection while the sending task is cancelled just as the write completes,
    the moment the race needs (deterministic: the cancel comes from inside the write itself)."""
    write = conn._send_packed_command
    task: asyncio.Task | None = None

    async def write_then_cancel(packed):
        await write(packed)
        task.cancel()

    conn._send_packed_command = write_then_cancel
    task = asyncio.create_task(conn.send_packed_command(conn.pack_command(*command), check_health=False))
    await asyncio.wait([task], timeout=5)
    del conn._send_packed_command
    return task


async def _connected(connection_class) -> Connection:
    conn = connection_class(host="127.0.0.1", port=6379, socket_timeout=5)
    await conn.connect()
    return conn


async def test_a_cancel_that_lands_as_a_command_is_written_cancels_the_call_and_closes_the_connection():
    conn = await _connected(CancellableConnection)
    task = await _cancel_as_written(conn, "ECHO", "stale")
    assert task.cancelled()
    assert not conn.is_connected  # its reply unread, the socket cannot serve another command
    await conn.send_command("ECHO", "fresh")  # reconnects; the stale reply died with the old socket
    assert await conn.read_response() == b"fresh"
    await conn.disconnect()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the race is in Python 3.11's asyncio.wait_for")
async def test_redis_pys_own_connection_loses_that_cancel_on_python_3_11():
    # Why CancellableConnection exists: if this starts failing, redis-py or Python has fixed the race.
    conn = await _connected(Connection)
    task = await _cancel_as_written(conn, "PING")
    assert not task.cancelled()
    await conn.disconnect()
