"""However often the fleet changes, browsers' dashboards are refreshed at a bounded rate, and the last change
is never lost (a trailing refresh follows a burst)."""

import asyncio

from channels.layers import get_channel_layer

from console.realtime.notify import DASHBOARD_GROUP, refresh_dashboards


async def drain(layer, channel: str, seconds: float) -> int:
    got = 0
    try:
        while True:
            await asyncio.wait_for(layer.receive(channel), timeout=seconds)
            got += 1
    except TimeoutError:
        return got


async def test_a_burst_of_changes_costs_two_refreshes(settings):
    settings.MODELGRID_DASHBOARD_REFRESH_SECONDS = 0.3
    layer = get_channel_layer()
    channel = await layer.new_channel("browser.")
    await layer.group_add(DASHBOARD_GROUP, channel)
    try:
        for _ in range(50):
            await refresh_dashboards()
        assert await drain(layer, channel, 0.6) == 2  # the first at once, one trailing for the rest
        await asyncio.sleep(0.35)
        await refresh_dashboards()  # after a quiet interval: at once again
        assert await drain(layer, channel, 0.1) == 1
    finally:
        await layer.group_discard(DASHBOARD_GROUP, channel)


async def test_a_burst_of_creates_wakes_the_scheduler_twice_not_once_each(monkeypatch):
    """Thousands of creates in a minute: the leader hears of them at a bounded rate, the last one never lost."""
    from console.realtime import notify
    from console.realtime.notify import SCHEDULER_GROUP, wake_scheduler_async

    monkeypatch.setattr(notify, "WAKE_INTERVAL", 0.3)
    layer = get_channel_layer()
    channel = await layer.new_channel("scheduler.")
    await layer.group_add(SCHEDULER_GROUP, channel)
    try:
        for _ in range(50):
            await wake_scheduler_async()
        assert await drain(layer, channel, 0.6) == 2  # at once, then one trailing for the rest of the burst
    finally:
        await layer.group_discard(SCHEDULER_GROUP, channel)
