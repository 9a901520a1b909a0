"""Pushes named by another console process: a scheduler leading there names, in one channel-layer message, the
hosts whose links it does not hold: those it gave a new desired state, and those to be sent theirs again (not
acknowledged: console/realtime/notify.push_desired). Every console process listens, and sends the links it holds
of the first the states the pass stored, read for all of them at once, and has each of the others read and send
its own whole. A message lost (Redis restarting) is repaired by the leader's resend of pushes not acknowledged
(console/control/loop.py) or by the agent's reconnect."""

from __future__ import annotations

import asyncio
import logging

from console.control.desired import stored_states
from console.dbthreads import own_thread
from console.realtime import links, notify
from console.realtime.perloop import for_this_loop

log = logging.getLogger("modelgrid.realtime")

# Per event loop: (joined, the listener task): the task held here, as asyncio keeps only weak references to tasks.
_listening: dict[asyncio.AbstractEventLoop, tuple[asyncio.Future, asyncio.Task]] = {}


async def listen() -> None:
    """Start this event loop's listener unless it runs; return once it has joined the group (or failed to: it
    keeps trying), so that a link held from now on hears every push named after this."""
    joined, _ = for_this_loop(_listening, _start)
    await asyncio.shield(joined)


def _start() -> tuple[asyncio.Future, asyncio.Task]:
    joined = asyncio.get_running_loop().create_future()
    delivering: set[asyncio.Task] = set()

    def on_message(message: dict) -> None:
        # A task each: a link whose agent reads slowly holds up its own push, not the next message.
        task = asyncio.create_task(deliver(message.get("hosts", ()), message.get("again", ())))
        delivering.add(task)
        task.add_done_callback(delivering.discard)

    def on_joined() -> None:
        if not joined.done():
            joined.set_result(None)

    listener = asyncio.create_task(notify.listen(notify.PUSH_GROUP, on_message, on_joined), name="desired-pushes")
    listener.add_done_callback(lambda _: on_joined())
    return joined, listener


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
