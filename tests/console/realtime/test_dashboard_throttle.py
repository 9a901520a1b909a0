"""However often the fleet changes, browsers' dashboards are refreshed at a bounded rate, and the last change
is never lost (a trailing refresh follows a burst)."""

import asyncio

from channels.layers import get_channel_layer

from console.control.hub import refresh_dashboards
from console.control.layer import DASHBOARD_GROUP


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
    from console.control import hub
    from console.control.hub import wake_scheduler_async
    from console.control.layer import SCHEDULER_GROUP

    monkeypatch.setattr(hub, "WAKE_INTERVAL", 0.3)
    layer = get_channel_layer()
    channel = await layer.new_channel("scheduler.")
    await layer.group_add(SCHEDULER_GROUP, channel)
    try:
        for _ in range(50):
            await wake_scheduler_async()
        assert await drain(layer, channel, 0.6) == 2  # at once, then one trailing for the rest of the burst
    finally:
        await layer.group_discard(SCHEDULER_GROUP, channel)
