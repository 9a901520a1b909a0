"""Channel-layer event names and group names in one place; events never carry agent input.

Every notification here is best effort: with the channel layer down (Redis restarting) it is logged and lost,
never raised into what triggered it (a committed API change, an applied intake batch). What it would have
told is repaired by the next scheduler pass, dashboard refresh or agent reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from console.realtime import links
from console.realtime.perloop import for_this_loop

DASHBOARD_GROUP = "dashboard"
SCHEDULER_GROUP = "scheduler"
GATEWAY_GROUP = "gateway"  # every console process's gateway: refresh the fleet snapshot now
PUSH_GROUP = "pushes"  # every console process: send the links you hold of these hosts their desired states


log = logging.getLogger("modelgrid.realtime")


def host_group(host_id: int) -> str:
    return f"agent.host.{host_id}"


async def _send(group: str, event: str, **fields) -> None:
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


async def push_desired(host_ids, states: dict[int, tuple[int, str]] | None = None) -> None:
    """Send each host its desired state. A link this process holds gets it handed over: the state in `states`
    (generation, the replicas' JSON text) as the pass built it, else the one stored, read and sent whole by the
    link even if it sent it before (a resend: the agent never acknowledged it). The other hosts are named in one
    channel-layer message, and each console process sends the links it holds theirs (console/realtime/pushes.py):
    one message per host cost four Redis round trips each, and with the scheduler in a process of its own 1,000
    hosts' pushes reached the last agent 82 s after the pass committed."""
    states = states or {}
    here, elsewhere = [], []
    for host_id in host_ids:
        (here if links.held(host_id) is not None else elsewhere).append(host_id)
    # All at once, not one after another: a pass that changed a hundred hosts would otherwise hold the last one's
    # push behind ninety-nine websocket sends.
    await asyncio.gather(*(links.push(h, states.get(h)) for h in here))
    if elsewhere:
        await _send(PUSH_GROUP, "desired.pushes", hosts=[h for h in elsewhere if h in states],
                    again=[h for h in elsewhere if h not in states])


def revoke_links(host_id: int) -> None:
    """For sync callers (a token rotation, on commit): every console process ends the host's links made with
    its old token."""
    try:
        async_to_sync(_send)(host_group(host_id), "link.revoked")
    except RuntimeError as e:  # called on a thread running an event loop: the old link lives to its next reconnect
        log.warning("channel layer: link.revoked to %s not sent (%s)", host_group(host_id), e)


async def refresh_gateways() -> None:
    await _send(GATEWAY_GROUP, "gateway.refresh")


class _Throttle:
    """At most one notification of a kind per interval per process, the last one never lost (trailing edge)."""

    def __init__(self) -> None:
        self.last = float("-inf")
        self.scheduled: asyncio.Task | None = None


_throttles: dict[asyncio.AbstractEventLoop, dict[str, _Throttle]] = {}  # per loop, by kind


async def _throttled(kind: str, interval: float, send) -> None:
    loop = asyncio.get_running_loop()
    throttle = for_this_loop(_throttles, dict).setdefault(kind, _Throttle())
    if throttle.scheduled is not None and not throttle.scheduled.done():
        return  # one is already due; it tells of this change too
    wait = throttle.last + interval - loop.time()
    if wait <= 0:
        throttle.last = loop.time()
        await send()
    else:
        throttle.scheduled = asyncio.create_task(_later(throttle, wait, send))


async def _later(throttle: _Throttle, wait: float, send) -> None:
    await asyncio.sleep(wait)
    throttle.last = asyncio.get_running_loop().time()
    await send()


async def refresh_dashboards() -> None:
    """Browsers' dashboards re-rendered: a busy fleet changes many times a second, and each refresh re-renders the
    page for every browser, so at most once per MODELGRID_DASHBOARD_REFRESH_SECONDS."""
    await _throttled("dashboard", settings.MODELGRID_DASHBOARD_REFRESH_SECONDS, _send_dashboard_update)


async def _send_dashboard_update() -> None:
    await _send(DASHBOARD_GROUP, "dashboard.update")


def recheck_browsers(user_ids: Iterable[int] | None, ended: Iterable[str] = ()) -> None:
    """For sync callers (a change of membership, password, activity or session, on commit): every console process
    re-checks the browser sockets of `user_ids` (None: everyone's) before it pushes them anything more, and closes
    those of the sessions `ended` (their keys' digests: console/realtime/access.py) without a check
    (console/realtime/browsers.py). Lost with the channel layer down: each process re-checks every socket every
    browsers.RECHECK_SECONDS anyway."""
    users = None if user_ids is None else sorted(user_ids)
    try:
        async_to_sync(_send)(DASHBOARD_GROUP, "dashboard.recheck", users=users, ended=list(ended))
    except RuntimeError as e:  # called on a thread running an event loop: the periodic re-check comes later
        log.warning("channel layer: dashboard.recheck not sent (%s)", e)


# A pass answers every wake-up that came before it began, and a busy console reads its channel layer one message
# at a time: a script creating thousands of deployments woke the scheduler once per create.
WAKE_INTERVAL = 0.1


async def wake_scheduler_async(states: bool = False) -> None:
    """Ask the scheduler leader (in whichever console process) for a pass now instead of at its next tick; at most
    one such message per WAKE_INTERVAL from this process, the last never lost. `states`: only replicas' observed
    states changed, which the plan does not read: the pass need only derive the deployments' states from them."""
    if states:
        await _throttled("scheduler-states", WAKE_INTERVAL, _send_states_wake)
    else:
        await _throttled("scheduler", WAKE_INTERVAL, _send_wake)


async def _send_wake() -> None:
    await _wake(states=False)


async def _send_states_wake() -> None:
    await _wake(states=True)


_scheduler_here: dict[asyncio.AbstractEventLoop, list[Callable[[bool], None]]] = {}


@contextlib.contextmanager
def waking_here(wake: Callable[[bool], None]) -> Iterator[None]:
    """While the scheduler leads on this event loop, wake-ups from this process call `wake(states)` directly: the
    channel layer can lose one (Redis restarting), and then only the leader's resync would notice the change."""
    here = for_this_loop(_scheduler_here, list)
    here.append(wake)
    try:
        yield
    finally:
        here.remove(wake)


async def _wake(states: bool) -> None:
    here = for_this_loop(_scheduler_here, list)
    if here:
        here[-1](states)
    elif states:
        await _send(SCHEDULER_GROUP, "scheduler.wake", states=True)
    else:
        await _send(SCHEDULER_GROUP, "scheduler.wake")


def wake_scheduler() -> None:
    """wake_scheduler_async for sync callers."""
    async_to_sync(wake_scheduler_async)()
