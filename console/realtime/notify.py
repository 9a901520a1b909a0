"""Channel-layer event names and group names in one place; events never carry agent input."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

DASHBOARD_GROUP = "dashboard"
SCHEDULER_GROUP = "scheduler"
GATEWAY_GROUP = "gateway"  # every console process's gateway: refresh the fleet snapshot now


def host_group(host_id: int) -> str:
    return f"agent.host.{host_id}"


async def push_desired(host_ids) -> None:
    layer = get_channel_layer()
    for host_id in host_ids:
        await layer.group_send(host_group(host_id), {"type": "desired.push"})


async def refresh_gateways() -> None:
    await get_channel_layer().group_send(GATEWAY_GROUP, {"type": "gateway.refresh"})


async def refresh_dashboards() -> None:
    await get_channel_layer().group_send(DASHBOARD_GROUP, {"type": "dashboard.update"})


def wake_scheduler() -> None:
    """Ask the scheduler loop for a pass now instead of at its next tick (sync callers)."""
    async_to_sync(get_channel_layer().group_send)(SCHEDULER_GROUP, {"type": "scheduler.wake"})
