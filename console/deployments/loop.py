"""The scheduler loop: run a reconcile pass, push changed hosts, refresh dashboards, repeat."""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from console.deployments.reconcile import reconcile_once
from console.gateway.metrics import METRICS
from console.realtime.notify import SCHEDULER_GROUP, push_desired, refresh_dashboards, refresh_gateways

log = logging.getLogger("modelgrid.scheduler")


async def run_pass() -> bool:
    """One unit of work; returns whether anything changed."""
    began = time.perf_counter()
    result = await database_sync_to_async(reconcile_once)()
    METRICS.pass_seconds.observe(time.perf_counter() - began)
    for action in result.actions:
        METRICS.actions.labels(action).inc()
    if result.changed_hosts:
        await push_desired(result.changed_hosts)
    if result.changed:
        await refresh_gateways()  # demand answers and placements: waiting requests learn of them now
        await refresh_dashboards()
    return result.changed


async def scheduler_loop(stop: asyncio.Event, interval: float) -> None:
    """A pass every `interval` seconds, or sooner when a deployment changes (wake_scheduler)."""
    layer = get_channel_layer()
    inbox = await layer.new_channel("scheduler.")
    await layer.group_add(SCHEDULER_GROUP, inbox)
    stopping = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            try:
                await run_pass()
            except Exception:  # one bad pass must not end the loop; the next pass retries
                log.exception("scheduler pass failed")
            woken = asyncio.create_task(layer.receive(inbox))
            await asyncio.wait({woken, stopping}, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
    finally:
        stopping.cancel()
        await layer.group_discard(SCHEDULER_GROUP, inbox)
