"""Channels' websocket consumer, less the stale-connection sweep it runs before every message it dispatches: the
agent link's (console/control/agent_link.py) and the browsers' (console/realtime/consumers.py)."""

from __future__ import annotations

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer


class Consumer(AsyncWebsocketConsumer):
    """Channels' consumer, less the stale-connection sweep it runs before every message it dispatches: that sweep
    runs on Channels' one thread-sensitive database thread, so every agent message and every desired-state push
    waited there behind the scheduler pass and everything else queued on that thread: 0.7-2.3 s at 100 hosts
    (docs/benchmarks.md). These handlers reach the database only through database_sync_to_async and own_thread,
    which close stale connections around each call themselves."""

    async def dispatch(self, message):
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)
