"""Pushes named by another console process: a scheduler leading there names, in one channel-layer message, the
hosts it gave a new desired state whose links it does not hold (console/realtime/notify.push_desired). Every
console process listens, and sends the links it holds of those hosts the states the pass stored, read for all of
them at once. A message lost (Redis restarting) is repaired by the leader's resend of pushes not acknowledged
(console/deployments/loop.py) or by the agent's reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.layers import get_channel_layer

from console.dbthreads import own_thread
from console.deployments.desired import stored_states
from console.realtime import links
from console.realtime.notify import PUSH_GROUP, subscribe
from console.realtime.perloop import for_this_loop

log = logging.getLogger("modelgrid.realtime")
RETRY_SECONDS = 1.0  # after the channel layer failed the listener

_listening: dict[asyncio.AbstractEventLoop, asyncio.Future] = {}


async def listen() -> None:
    """Start this event loop's listener unless it runs; return once it has joined the group (or failed to: it
    keeps trying), so that a link held from now on hears every push named after this."""
    joined = for_this_loop(_listening, _start)
    await asyncio.shield(joined)


def _start() -> asyncio.Future:
    joined = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(_listen(joined), name="desired-pushes")
    task.add_done_callback(lambda t: joined.done() or joined.set_result(None))
    return joined


async def _listen(joined: asyncio.Future) -> None:
    layer = get_channel_layer()
    while True:
        inbox = None
        try:
            inbox = await subscribe(PUSH_GROUP)
            if not joined.done():
                joined.set_result(None)
            while True:
                message = await layer.receive(inbox)
                await deliver(message["hosts"])
        except asyncio.CancelledError:
            if inbox is not None:
                with contextlib.suppress(Exception):
                    await layer.group_discard(PUSH_GROUP, inbox)
            raise
        except Exception as e:
            log.warning("channel layer: listening for pushes failed (%s: %s); again in %g s", type(e).__name__, e,
                        RETRY_SECONDS)
            if not joined.done():
                joined.set_result(None)  # a hello does not wait for Redis: the resend repairs what this misses
            await asyncio.sleep(RETRY_SECONDS)


async def deliver(host_ids) -> None:
    """Send the links held here of these hosts their stored desired states."""
    here = [h for h in host_ids if links.held(h) is not None]
    if not here:
        return
    states = await own_thread(stored_states)(here)
    await asyncio.gather(*(links.push(h, states.get(h)) for h in here))
