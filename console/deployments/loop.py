"""The scheduler loop: while this process leads the scheduler, run a reconcile pass, push changed hosts, refresh
dashboards, repeat; while another leads, try again every MODELGRID_LEADER_RETRY_SECONDS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from console.deployments.leader import Elector, NotLeader, current_leader
from console.deployments.reconcile import reconcile_once, start_leading
from console.gateway.metrics import METRICS
from console.realtime.notify import SCHEDULER_GROUP, push_desired, refresh_dashboards, refresh_gateways

log = logging.getLogger("modelgrid.scheduler")
PASS_REST = 2.0


async def run_pass(fence: Callable[[], None] | None = None) -> bool:
    """One unit of work; returns whether anything changed. `fence` aborts the pass (NotLeader) before it writes."""
    began = time.perf_counter()
    # On Channels' one database thread, with the agent links' intake and the API: run beside them, a pass
    # (replicas, then hosts) and a request or an intake batch (hosts, then replicas) deadlock on PostgreSQL.
    result = await database_sync_to_async(reconcile_once)(fence)
    METRICS.pass_seconds.observe(time.perf_counter() - began)
    for action in result.actions:
        METRICS.actions.labels(action).inc()
    if result.changed_hosts:
        await push_desired(result.changed_hosts)
    if result.changed:
        await refresh_gateways()  # demand answers and placements: waiting requests learn of them now
        await refresh_dashboards()
    return result.changed


def _who_leads() -> str:
    info = current_leader()
    return f"{info.holder}, epoch {info.epoch}" if info else "none yet"


async def _follow(elector: Elector, stop: asyncio.Event, retry: float, announce: bool) -> bool:
    """Try to become leader; when another process leads, wait `retry` seconds (or for `stop`). True when leading."""
    if await database_sync_to_async(elector.try_lead)():
        log.info("leading scheduler (epoch %d)", elector.epoch)
        start_leading()  # agents get the reconnect grace before any lease of theirs can lapse
        return True
    if announce:
        log.info("following (leader: %s)", await database_sync_to_async(_who_leads)())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), retry)
    return False


async def _lead(elector: Elector, stop: asyncio.Event, interval: float) -> None:
    """Passes every `interval` seconds, or sooner when a deployment changes (wake_scheduler), until `stop` or
    until this process no longer leads. Only the leader listens for wake-ups: followers would let them pile up."""
    layer = get_channel_layer()
    inbox = await layer.new_channel("scheduler.")
    await layer.group_add(SCHEDULER_GROUP, inbox)
    stopping = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            began = time.monotonic()
            try:
                await run_pass(elector.fence)
            except NotLeader as e:
                log.warning("no longer leading the scheduler: %s", e)
                return
            except Exception:  # one bad pass must not end the loop; the next pass retries
                log.exception("scheduler pass failed")
            # A big fleet's pass takes long: the loop rests PASS_REST times as long before its next tick, so
            # passes use at most a third of a core however large the fleet (a wake-up still comes at once).
            rest = max(interval, PASS_REST * (time.monotonic() - began))
            woken = asyncio.create_task(layer.receive(inbox))
            await asyncio.wait({woken, stopping}, timeout=rest, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
    finally:
        stopping.cancel()
        await layer.group_discard(SCHEDULER_GROUP, inbox)


async def scheduler_loop(stop: asyncio.Event, interval: float, elector: Elector | None = None,
                         retry: float | None = None) -> None:
    """Take part in the scheduler election until `stop`: run passes while leading, else retry every `retry`
    seconds (default MODELGRID_LEADER_RETRY_SECONDS). Leadership is given up on the way out."""
    retry = settings.MODELGRID_LEADER_RETRY_SECONDS if retry is None else retry
    if elector is None:
        elector = await database_sync_to_async(Elector)()
    announce = True  # "following" once per change, not every retry
    try:
        while not stop.is_set():
            try:
                leading = await _follow(elector, stop, retry, announce)
            except Exception:  # the database is unreachable: nobody can lead through it; try again later
                log.exception("cannot take part in the scheduler election")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), retry)
                continue
            announce = False
            if leading:
                await _lead(elector, stop, interval)
                await database_sync_to_async(elector.step_down)()
                announce = True
    finally:
        # Here, not on the database's thread: a pass stuck there (then cancelled) must not keep the lock held.
        elector.step_down()
