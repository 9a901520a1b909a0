"""A receive cancelled while it waits for its channel's lock leaves nothing behind for a later event loop.

The probe: in CI's PostgreSQL + Redis pass, 13 consumer tests failed with "<asyncio.locks.Lock ...> is bound to
a different event loop": an earlier test's consumer, closed while its receive waited for the previous message's
cleanup, had left channels_redis's per-channel lock counted as awaited forever, bound to that test's loop."""

from __future__ import annotations

import asyncio
import os

import pytest
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from channels_redis.core import RedisChannelLayer
from django.conf import settings

pytestmark = [pytest.mark.db_stack,
              pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (the PostgreSQL + Redis pass)")]


def _a_receive_cancelled_while_waiting_for_the_lock(layer, channel: str) -> None:
    """On an event loop of its own: the channel's lock held (a popped message's cleanup runs), a receive waits
    for it and is cancelled (its consumer closes), then the lock is let go."""
    async def run():
        key = layer.prefix + channel
        await layer.receive_clean_locks.acquire(key)
        waiting = asyncio.create_task(layer.receive_single(channel))
        await asyncio.sleep(0.05)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        layer.receive_clean_locks.release(key)

    asyncio.run(run())


def _a_message_received_while_the_lock_is_held(layer, channel: str):
    """On another event loop: a receive that has to wait for the lock, which is then let go, and a message."""
    async def run():
        key = layer.prefix + channel
        await layer.receive_clean_locks.acquire(key)
        receiving = asyncio.create_task(layer.receive(channel + "inbox"))
        await asyncio.sleep(0.05)
        layer.receive_clean_locks.release(key)
        await layer.send(channel + "inbox", {"type": "hello"})
        return await asyncio.wait_for(receiving, timeout=10)

    return asyncio.run(run())


def _process_channel(layer) -> str:
    """The process-local channel prefix ("specific.<client>!") a consumer's receive pops from."""
    return layer.non_local_name(asyncio.run(layer.new_channel()))


def test_the_configured_layer_receives_on_a_new_loop_after_a_receive_was_cancelled_waiting_for_the_lock():
    layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
    assert type(layer).__module__ == "console.realtime.redis_layer", settings.CHANNEL_LAYERS
    channel = _process_channel(layer)
    _a_receive_cancelled_while_waiting_for_the_lock(layer, channel)
    assert not layer.receive_clean_locks.locks  # nobody holds or awaits it: dropped
    assert _a_message_received_while_the_lock_is_held(layer, channel) == {"type": "hello"}


def test_channels_redis_own_layer_leaks_that_lock():
    # Why console.realtime.redis_layer exists: if this starts failing, channels_redis has fixed the leak.
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS[DEFAULT_CHANNEL_LAYER]["CONFIG"])
    channel = _process_channel(layer)
    _a_receive_cancelled_while_waiting_for_the_lock(layer, channel)
    with pytest.raises(RuntimeError, match="bound to a different event loop"):
        _a_message_received_while_the_lock_is_held(layer, channel)
