"""The channel layer's groups and its best-effort send and listen, in one place; events never carry agent input.

Every send here is best effort: with the channel layer down (Redis restarting) it is logged and lost, never raised
into what triggered it (a committed API change, an applied intake batch). What it would have told is repaired by the
next scheduler pass, dashboard refresh or agent reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

DASHBOARD_GROUP = "dashboard"
SCHEDULER_GROUP = "scheduler"
GATEWAY_GROUP = "gateway"  # every console process's gateway: refresh the fleet snapshot now
PUSH_GROUP = "pushes"  # every console process: send the links you hold of these hosts their desired states

log = logging.getLogger("modelgrid.realtime")


def host_group(host_id: int) -> str:
    return f"agent.host.{host_id}"


async def send(group: str, event: str, **fields) -> None:
    """`event` to `group`, logged and dropped if the channel layer fails it."""
    try:
        await get_channel_layer().group_send(group, {"type": event, **fields})
    except Exception as e:
        log.warning("channel layer: %s to %s lost (%s: %s)", event, group, type(e).__name__, e)


async def subscribe(group: str) -> str:
    """A channel of this process's own in `group`, for a loop that reads its events (layer.receive).

    Always with the layer's default prefix: channels_redis gives a process one receive lock, held by whichever
    reader is popping its process-local messages from Redis, and pops one key per prefix. A channel with a
    prefix of its own ("scheduler.") lived under a key nobody popped while an agent link held the lock, so its
    events waited for that reader's 5-second pop to time out: creates woke the scheduler up to 5 s late."""
    layer = get_channel_layer()
    inbox = await layer.new_channel()
    await layer.group_add(group, inbox)
    return inbox


# A listener's group membership is renewed this often: channels_redis drops members older than its group expiry (a
# day), and a Redis restarted without its data has none.
REJOIN_SECONDS = 60.0
RETRY_SECONDS = 1.0  # after the channel layer failed a listener


async def listen(group: str, handle: Callable[[dict], None], joined: Callable[[], None] = lambda: None) -> None:
    """Call `handle` with each event of `group` for as long as the task runs, on a channel of this process's own
    (subscribe), its membership renewed every REJOIN_SECONDS; joined anew RETRY_SECONDS after the channel layer
    fails. `joined` is called each time it has joined, or failed to (whoever waits for it must not wait for Redis).
    It leaves the group on the way out."""
    layer = get_channel_layer()
    while True:
        inbox = renewing = None
        try:
            inbox = await subscribe(group)
            joined()
            renewing = asyncio.create_task(_renew(layer, group, inbox))
            while True:
                handle(await layer.receive(inbox))
        except Exception as e:
            log.warning("channel layer: listening to %s failed (%s: %s); again in %g s", group, type(e).__name__, e,
                        RETRY_SECONDS)
            joined()
        finally:
            if renewing is not None:
                renewing.cancel()
            if inbox is not None:
                with contextlib.suppress(Exception):
                    await layer.group_discard(group, inbox)
        await asyncio.sleep(RETRY_SECONDS)


async def _renew(layer, group: str, inbox: str) -> None:
    while True:
        await asyncio.sleep(REJOIN_SECONDS)
        try:
            await layer.group_add(group, inbox)
        except Exception as e:  # the listener's receive fails too, and it joins anew
            log.warning("channel layer: renewing %s failed (%s: %s)", group, type(e).__name__, e)


def revoke_links(host_id: int) -> None:
    """For sync callers (a token rotation, on commit): every console process ends the host's links made with
    its old token."""
    try:
        async_to_sync(send)(host_group(host_id), "link.revoked")
    except RuntimeError as e:  # called on a thread running an event loop: the old link lives to its next reconnect
        log.warning("channel layer: link.revoked to %s not sent (%s)", host_group(host_id), e)


async def refresh_gateways() -> None:
    await send(GATEWAY_GROUP, "gateway.refresh")


def recheck_browsers(user_ids: Iterable[int] | None, ended: Iterable[str] = ()) -> None:
    """For sync callers (a change of membership, password, activity or session, on commit): every console process
    re-checks the browser sockets of `user_ids` (None: everyone's) before it pushes them anything more, and closes
    those of the sessions `ended` (their keys' digests: console/realtime/access.py) without a check
    (console/realtime/browsers.py). Lost with the channel layer down: each process re-checks every socket every
    browsers.RECHECK_SECONDS anyway."""
    users = None if user_ids is None else sorted(user_ids)
    try:
        async_to_sync(send)(DASHBOARD_GROUP, "dashboard.recheck", users=users, ended=list(ended))
    except RuntimeError as e:  # called on a thread running an event loop: the periodic re-check comes later
        log.warning("channel layer: dashboard.recheck not sent (%s)", e)
