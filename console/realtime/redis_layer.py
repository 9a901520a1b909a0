"""The Redis channel layer the console runs (CHANNEL_LAYERS' BACKEND when REDIS_URL is set)."""

from __future__ import annotations

from channels_redis.core import ChannelLock, RedisChannelLayer


class ReleasingChannelLock(ChannelLock):
    """channels_redis's per-channel locks without their leak: a waiter cancelled in acquire() stayed counted.

    A receive that pops a message holds its channel's lock until the message's backup copy is cleaned, and the
    next receive waits for it; a consumer whose receive is cancelled meanwhile (its websocket closing) left the
    count one too high, so the lock was never dropped. In one event loop that only keeps a lock alive, but the
    lock stays bound to the loop it was contended in, and a receive on any later loop that has to wait for it
    fails ("... is bound to a different event loop"). The suite runs a loop per test: once a consumer test leaked
    the lock, every later test of a consumer on Redis failed (13 in one CI run)."""

    async def acquire(self, channel):
        try:
            return await super().acquire(channel)
        except BaseException:  # not acquired (asyncio.Lock hands a cancelled waiter's turn on): no longer waiting
            self.wait_counts[channel] -= 1
            if self.wait_counts[channel] < 1:
                del self.locks[channel]
                del self.wait_counts[channel]
            raise


class ChannelLayer(RedisChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.receive_clean_locks = ReleasingChannelLock()
