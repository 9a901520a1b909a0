"""The Redis connection the channel layer uses (CHANNEL_LAYERS' connection_class)."""

from __future__ import annotations

import asyncio

from redis.asyncio.connection import Connection


class CancellableConnection(Connection):
    """A redis-py connection whose calls stay cancellable on Python 3.11.

    redis-py writes each command under asyncio.wait_for, and Python 3.11's wait_for returns normally when a
    cancellation arrives just as the wrapped write completes (CPython gh-86296, fixed in 3.12). A Channels
    consumer's receive() cancelled at that moment then popped forever, and whatever awaited it (a websocket's
    teardown, the gateway's close) hung. The lost request still shows in the task's cancelling() count, so it
    is raised here; the command's reply was never read, so the socket is closed first."""

    async def send_packed_command(self, command, check_health: bool = True) -> None:
        task = asyncio.current_task()
        requested = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)
        if task is not None and task.cancelling() > requested:
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError
