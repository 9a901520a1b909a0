"""Pushes named by another console process: a scheduler leading there names, in one channel-layer message, the
hosts whose links it does not hold: those it gave a new desired state, and those to be sent theirs again (not
acknowledged: console/realtime/notify.push_desired). Every console process listens, and sends the links it holds
of the first the states the pass stored, read for all of them at once, and has each of the others read and send
its own whole. A message lost (Redis restarting) is repaired by the leader's resend of pushes not acknowledged
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
# The group membership is renewed this often: channels_redis drops members older than its group expiry (a day),
# and a Redis restarted without its data has none.
REJOIN_SECONDS = 60.0

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
    delivering: set[asyncio.Task] = set()
    while True:
        inbox = rejoin = None
        try:
            inbox = await subscribe(PUSH_GROUP)
            if not joined.done():
                joined.set_result(None)
            rejoin = asyncio.create_task(_rejoin(layer, inbox))
            while True:
                message = await layer.receive(inbox)
                # A task each: a link whose agent reads slowly holds up its own push, not the next message.
                task = asyncio.create_task(deliver(message.get("hosts", ()), message.get("again", ())))
                delivering.add(task)
                task.add_done_callback(delivering.discard)
        except asyncio.CancelledError:
            for task in delivering:
                task.cancel()
            raise
        except Exception as e:
            log.warning("channel layer: listening for pushes failed (%s: %s); again in %g s", type(e).__name__, e,
                        RETRY_SECONDS)
            if not joined.done():
                joined.set_result(None)  # a hello does not wait for Redis: the resend repairs what this misses
        finally:
            if rejoin is not None:
                rejoin.cancel()
            if inbox is not None:
                with contextlib.suppress(Exception):
                    await layer.group_discard(PUSH_GROUP, inbox)
        await asyncio.sleep(RETRY_SECONDS)


async def _rejoin(layer, inbox: str) -> None:
    while True:
        await asyncio.sleep(REJOIN_SECONDS)
        try:
            await layer.group_add(PUSH_GROUP, inbox)
        except Exception as e:  # the listener's receive fails too, and it joins anew
            log.warning("channel layer: renewing the pushes group failed (%s: %s)", type(e).__name__, e)


async def deliver(host_ids, again=()) -> None:
    """Send the links held here of `host_ids` their stored desired states, and have those of `again` read and
    send theirs whole (a link drops a stored state it has sent already; a resend must go out regardless)."""
    here = [h for h in host_ids if links.held(h) is not None]
    try:
        states = await own_thread(stored_states)(here) if here else {}
    except Exception as e:  # the database is down, say: each link reads its own (and fails alike, or not)
        log.warning("reading stored desired states failed (%s: %s); each link reads its own", type(e).__name__, e)
        states = {}
    await asyncio.gather(*(links.push(h, states.get(h)) for h in here),
                         *(links.push(h) for h in again if links.held(h) is not None))
