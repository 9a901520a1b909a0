"""The channel layer's listener (console/control/layer.py)."""

import asyncio
import contextlib

from console.control import layer as layer_module


class FlakyLayer:
    """A channel layer that records group membership and fails one receive (Redis restarting)."""

    def __init__(self) -> None:
        self.adds: list[tuple[str, str]] = []
        self.discards: list[tuple[str, str]] = []
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.channels = 0

    async def new_channel(self) -> str:
        self.channels += 1
        return f"inbox-{self.channels}"

    async def group_add(self, group, channel) -> None:
        self.adds.append((group, channel))

    async def group_discard(self, group, channel) -> None:
        self.discards.append((group, channel))

    async def receive(self, channel):
        message = await self.inbox.get()
        if isinstance(message, Exception):
            raise message
        return message


async def test_a_listener_renews_its_group_membership_and_joins_anew_after_the_layer_fails(monkeypatch):
    """channels_redis drops a group's members older than its group expiry (a day), and a Redis restarted without
    its data has none: a listener joined once stopped hearing its group (wake-ups, gateway refreshes, pushes)."""
    layer = FlakyLayer()
    monkeypatch.setattr(layer_module, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(layer_module, "REJOIN_SECONDS", 0.05)
    monkeypatch.setattr(layer_module, "RETRY_SECONDS", 0.05)
    heard, joined = [], asyncio.Event()
    task = asyncio.create_task(layer_module.listen("g", heard.append, joined.set))
    try:
        async with asyncio.timeout(5):
            await joined.wait()
            while layer.adds.count(("g", "inbox-1")) < 3:  # renewed while it listens
                await asyncio.sleep(0.01)
            await layer.inbox.put({"n": 1})
            await layer.inbox.put(ConnectionError("redis restarting"))
            await layer.inbox.put({"n": 2})
            while len(heard) < 2:
                await asyncio.sleep(0.01)
        assert heard == [{"n": 1}, {"n": 2}]
        assert ("g", "inbox-1") in layer.discards and ("g", "inbox-2") in layer.adds  # left, then joined anew
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert ("g", "inbox-2") in layer.discards  # and left on the way out
