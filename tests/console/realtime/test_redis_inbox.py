"""An event loop's inbox (the scheduler's wake-ups, the gateway's refreshes) hears its group at once on the Redis
channel layer, while an agent link of the same process waits on its own channel: channels_redis gives a process
one receive lock and pops one key per channel prefix, so an inbox with a prefix of its own waited for the link's
5-second pop to time out."""

from __future__ import annotations

import asyncio
import os

import pytest
from channels.layers import get_channel_layer

from console.control.layer import subscribe

pytestmark = [pytest.mark.db_stack,
              pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (the PostgreSQL + Redis pass)")]


async def test_an_inbox_hears_its_group_while_a_link_of_the_process_waits_on_its_own_channel():
    layer = get_channel_layer()
    link = await layer.new_channel()
    waiting = asyncio.ensure_future(layer.receive(link))  # an agent link with nothing to hear: it holds the lock
    try:
        await asyncio.sleep(0.3)
        inbox = await subscribe("test-inbox")
        heard = asyncio.ensure_future(layer.receive(inbox))
        await asyncio.sleep(0.1)
        await layer.group_send("test-inbox", {"type": "scheduler.wake"})
        done, _ = await asyncio.wait([heard], timeout=2)  # at once; with its own prefix it took up to 5 s
        assert heard in done and heard.result() == {"type": "scheduler.wake"}
        await layer.group_discard("test-inbox", inbox)
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
