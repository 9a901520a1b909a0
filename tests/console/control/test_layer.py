import asyncio
import contextlib

from console.realtime import notify


async def test_pushes_for_links_held_elsewhere_go_out_as_one_message_naming_the_hosts(monkeypatch):
    """One channel-layer message per pass, not one per host: a thousand per-host messages through Redis reached the
    last agent tens of seconds after the pass committed when the scheduler ran in a process of its own."""
    sent = []

    async def send(group, event, **fields):
        sent.append((group, event, fields))

    monkeypatch.setattr(notify, "_send", send)
    # Hosts with a state the pass built, and hosts to be sent theirs again (not acknowledged: a resend).
    await notify.push_desired(range(100), {h: (1, []) for h in range(0, 100, 2)})
    assert sent == [(notify.PUSH_GROUP, "desired.pushes", {"hosts": list(range(0, 100, 2)),
                                                           "again": list(range(1, 100, 2))})]
    sent.clear()
    await notify.push_desired([])
    assert sent == []


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
    monkeypatch.setattr(notify, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(notify, "REJOIN_SECONDS", 0.05)
    monkeypatch.setattr(notify, "RETRY_SECONDS", 0.05)
    heard, joined = [], asyncio.Event()
    task = asyncio.create_task(notify.listen("g", heard.append, joined.set))
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
