"""The hub: this console process's agent links, the desired-state pushes handed to them, the acks due for those
pushes, the scheduler passes under way, and the scheduler wake-ups, on one object (hub()). Whatever waits for one
of these (readings and chores for the acks, the scheduler for a wake-up) is woken by the change itself.

Why links are held here: through Redis a push is a group_send of four round trips, and the receiving process then
pops its messages one round trip at a time, so a pass that changed 100 hosts reached the last of them 0.75 s after
its commit (and 1,000 hosts many seconds), on an event loop that every agent message also needs. A link held here
costs a function call. Hosts whose links are in another process (or in none) are named in one channel-layer message
per push (push_desired, listen_for_pushes); in the moment a newer link elsewhere supersedes one held here, a push
may reach only the old link, and the new one then has what its hello read, or the resend of a push not
acknowledged (console/control/loop.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import async_to_sync
from django.conf import settings

from console.control import layer
from console.perloop import for_this_loop

log = logging.getLogger("modelgrid.realtime")

# A push this long without its ack no longer counts as due (its agent hung, or the ack was lost): the resend of
# pushes not acknowledged repairs it, and nothing here should wait on it meanwhile.
ACK_EXPECTED_SECONDS = 2.0
# A pass is waited for (after_acks) at most this long after it began: one whose pushes cannot be handed over (an
# agent that stopped reading, the channel layer down) must not hold intake's readings back with it. At 1,000 hosts
# a pass takes 1.5-4 s here.
PASS_WAIT_SECONDS = 10.0
# A pass answers every wake-up that came before it began, and a busy console reads its channel layer one message
# at a time: a script creating thousands of deployments woke the scheduler once per create.
WAKE_INTERVAL = 0.1


class Link(Protocol):
    async def desired_push(self, event: dict) -> None: ...


@dataclass
class _Passes:
    begun: int = 0  # scheduler passes begun on this loop (planning)
    ended: int = 0  # and ended
    since: float = float("-inf")  # time.monotonic() when the last one began
    sent: float = float("-inf")  # when a link here last sent a push
    pushed: float = float("-inf")  # when the last pass that sent pushes ended


class _Throttle:
    """At most one notification of a kind per interval per process, the last one never lost (trailing edge)."""

    def __init__(self) -> None:
        self.last = float("-inf")
        self.scheduled: asyncio.Task | None = None


class Hub:
    """One per console process (its event loop): see the module's docstring. Its methods run on that loop."""

    def __init__(self) -> None:
        self._links: dict[int, Link] = {}
        # Host -> (the generation its link here was sent, when), until an ack covers it or the link ends; in the
        # order sent, so the pushes no longer due (ACK_EXPECTED_SECONDS) are the oldest and the newest is the last.
        self._due: dict[int, tuple[int, float]] = {}
        self._passes = _Passes()
        self._changed = asyncio.Event()  # set, and replaced, when a pass ends or the newest due push is answered
        self._throttles: dict[str, _Throttle] = {}
        self._wakers: list[Callable[[bool], None]] = []  # the scheduler leading on this loop (waking_here)
        self._pushes_joined: asyncio.Future | None = None
        self._tasks: set[asyncio.Task] = set()  # held: asyncio keeps only weak references to tasks
        self.browsers: Any = None  # the browser sockets' state of this process (console/realtime/browsers.py)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _keep(self, task: asyncio.Task) -> asyncio.Task:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # Links.

    def hold(self, host_id: int, link: Link) -> None:
        """`link` is now this process's link of the host (its newest hello here)."""
        self._links[host_id] = link

    def release(self, host_id: int, link: Link) -> None:
        """`link` ended; a newer link of the host held here stays."""
        if self._links.get(host_id) is link:
            del self._links[host_id]
            self._answered(host_id)

    def held(self, host_id: int) -> Link | None:
        return self._links.get(host_id)

    # Acks.

    def sent(self, host_id: int, generation: int) -> None:
        """The host's link here sent its agent `generation`: an ack is due."""
        now = time.monotonic()
        self._due.pop(host_id, None)  # to the end: the entries stay in the order sent
        self._due[host_id] = generation, now
        self._passes.sent = now

    def acknowledged(self, host_id: int, generation: int) -> None:
        """The host's agent acknowledged `generation` (read here, not applied yet)."""
        if host_id in self._due and self._due[host_id][0] <= generation:
            self._answered(host_id)

    def _answered(self, host_id: int) -> None:
        if host_id not in self._due:
            return
        newest = next(reversed(self._due)) == host_id
        del self._due[host_id]
        if newest:  # whether any push is due is read from the newest alone (_due_until): waiters look again
            self._notify()

    def acks_due(self) -> int:
        """How many pushes sent from here in the last ACK_EXPECTED_SECONDS are still waiting for their ack (for tests
        and diagnostics: after_acks reads only the newest)."""
        since, count = time.monotonic() - ACK_EXPECTED_SECONDS, 0
        for _, at in reversed(self._due.values()):
            if at < since:
                break  # this one and every older one are no longer due
            count += 1
        return count

    def _due_until(self) -> float:
        """Until when (time.monotonic()) some push stays due unless answered: the newest's, the others being older."""
        return next(reversed(self._due.values()))[1] + ACK_EXPECTED_SECONDS if self._due else float("-inf")

    # Scheduler passes.

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """A scheduler pass is under way on this event loop, from before it plans until its pushes are handed over:
        after_acks waits for it. The pass's commit sends a wave at once (a push to each of a thousand hosts in a
        rollout). Intake's readings that began during a pass took the interpreter from it, and those that reached the
        replica rows it had locked to write waited there and then ran on into that wave the moment it committed: up
        to 0.6 s of a thread sharing the interpreter lock with the event loop that sends the pushes and reads the
        acks (a throwaway trace, docs/benchmarks.md)."""
        passes = self._passes
        passes.begun += 1
        passes.since = began = time.monotonic()
        try:
            yield
        finally:
            passes.ended += 1
            if passes.sent >= began:  # it pushed: the acks' bound counts from here (after_acks)
                passes.pushed = time.monotonic()
            self._notify()

    def planning_now(self) -> bool:
        """Whether a scheduler pass is under way on this event loop (planning), for tests and diagnostics."""
        return self._passes.ended < self._passes.begun

    async def after_acks(self, since: float, limit: float) -> None:
        """Until the scheduler passes under way here when called have ended (planning; each waited for at most
        PASS_WAIT_SECONDS after it began) and no acks are due here (acks_due), or, for the acks, `limit` seconds
        after `since` (time.monotonic()) or after the last pass here that pushed ended, whichever is later: how work
        that can wait (intake's readings, the leader's chores) lets a pass and its wave of pushes be sent and
        answered first, on the one interpreter the event loop shares with it. A pass begun after the call is not
        waited for. Woken by a pass's end and by the answer to the newest push; otherwise it sleeps until the first
        of its bounds."""
        passes, under_way = self._passes, self._passes.begun
        while True:
            now, bounds = time.monotonic(), []
            if passes.ended < under_way and now - passes.since < PASS_WAIT_SECONDS:
                bounds.append(passes.since + PASS_WAIT_SECONDS)
            acks_until = min(self._due_until(), max(since, passes.pushed) + limit)
            if acks_until > now:
                bounds.append(acks_until)
            if not bounds:
                return
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(bounds) - now):
                    await changed.wait()

    # Pushes.

    async def push(self, host_id: int, state: tuple[int, str] | None = None) -> None:
        """Hand the host's link held here (if any) its desired state: `state` (generation, the replicas' JSON text),
        else the one stored, read by the link."""
        link = self.held(host_id)
        if link is None:
            return
        event: dict = {"type": "desired.push"}
        if state is not None:
            event["generation"], event["replicas_json"] = state
        try:
            await link.desired_push(event)
        except Exception as e:  # its socket just closed, say: the agent's reconnect gets the state anyway
            log.warning("push to host %s's link lost (%s: %s)", host_id, type(e).__name__, e)

    async def push_desired(self, host_ids, states: dict[int, tuple[int, str]] | None = None) -> None:
        """Send each host its desired state. A link held here gets it handed over: the state in `states` (generation,
        the replicas' JSON text) as the pass built it, else the one stored, read and sent whole by the link even if
        it sent it before (a resend: the agent never acknowledged it). The other hosts are named in one
        channel-layer message, and each console process sends the links it holds theirs (listen_for_pushes): one
        message per host cost four Redis round trips each, and with the scheduler in a process of its own 1,000
        hosts' pushes reached the last agent 82 s after the pass committed."""
        states = states or {}
        here, elsewhere = [], []
        for host_id in host_ids:
            (here if self.held(host_id) is not None else elsewhere).append(host_id)
        # All at once, not one after another: a pass that changed a hundred hosts would otherwise hold the last
        # one's push behind ninety-nine websocket sends.
        await asyncio.gather(*(self.push(h, states.get(h)) for h in here))
        if elsewhere:
            await layer.send(layer.PUSH_GROUP, "desired.pushes", hosts=[h for h in elsewhere if h in states],
                             again=[h for h in elsewhere if h not in states])

    async def listen_for_pushes(self, deliver: Callable[[list[int], list[int]], Awaitable[None]]) -> None:
        """Start this process's listener for the pushes another process's scheduler names, unless it runs: each
        message's hosts and hosts to send again go to `deliver` (console/control/agent_link.py). Returns once it has
        joined the group (or failed to: it keeps trying), so that a link held from now on hears every push named
        after this. A message lost (Redis restarting) is repaired by the leader's resend of pushes not acknowledged
        or by the agent's reconnect."""
        if self._pushes_joined is None:
            joined = self._pushes_joined = asyncio.get_running_loop().create_future()

            def on_message(message: dict) -> None:
                # A task each: a link whose agent reads slowly holds up its own push, not the next message.
                self._keep(asyncio.create_task(deliver(message.get("hosts", []), message.get("again", []))))

            def on_joined() -> None:
                if not joined.done():
                    joined.set_result(None)

            listener = self._keep(asyncio.create_task(layer.listen(layer.PUSH_GROUP, on_message, on_joined),
                                                      name="desired-pushes"))
            listener.add_done_callback(lambda _: on_joined())
        await asyncio.shield(self._pushes_joined)

    # Wake-ups.

    async def throttled(self, kind: str, interval: float, send: Callable[[], Awaitable[None]]) -> None:
        """`send()` now, unless one of `kind` went out less than `interval` seconds ago: then once, at the end of the
        interval, for all the calls meanwhile."""
        loop = asyncio.get_running_loop()
        throttle = self._throttles.setdefault(kind, _Throttle())
        if throttle.scheduled is not None and not throttle.scheduled.done():
            return  # one is already due; it tells of this change too
        wait = throttle.last + interval - loop.time()
        if wait <= 0:
            throttle.last = loop.time()
            await send()
        else:
            throttle.scheduled = self._keep(asyncio.create_task(_later(throttle, wait, send)))

    @contextlib.contextmanager
    def waking_here(self, wake: Callable[[bool], None]) -> Iterator[None]:
        """While the scheduler leads on this event loop, wake-ups from this process call `wake(states)` directly:
        the channel layer can lose one (Redis restarting), and then only the leader's resync would notice."""
        self._wakers.append(wake)
        try:
            yield
        finally:
            self._wakers.remove(wake)

    async def wake_scheduler(self, states: bool = False) -> None:
        """Ask the scheduler leader (in whichever console process) for a pass now instead of at its next tick; at
        most one such message per WAKE_INTERVAL from this process, the last never lost. `states`: only replicas'
        observed states changed, which the plan does not read: the pass need only derive the deployments' states."""
        await self.throttled("scheduler-states" if states else "scheduler", WAKE_INTERVAL,
                             lambda: self._wake(states))

    async def _wake(self, states: bool) -> None:
        if self._wakers:
            self._wakers[-1](states)
        elif states:
            await layer.send(layer.SCHEDULER_GROUP, "scheduler.wake", states=True)
        else:
            await layer.send(layer.SCHEDULER_GROUP, "scheduler.wake")


async def _later(throttle: _Throttle, wait: float, send: Callable[[], Awaitable[None]]) -> None:
    await asyncio.sleep(wait)
    throttle.last = asyncio.get_running_loop().time()
    await send()


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    """This process's hub. Kept by event loop, as its events and tasks belong to one: a console process runs one,
    the test suite one per test, and async_to_sync a passing one of its own in a sync caller's thread."""
    return for_this_loop(_hubs, Hub)


async def refresh_dashboards() -> None:
    """Browsers' dashboards re-rendered: a busy fleet changes many times a second, and each refresh re-renders the
    page for every browser, so at most once per MODELGRID_DASHBOARD_REFRESH_SECONDS."""
    await hub().throttled("dashboard", settings.MODELGRID_DASHBOARD_REFRESH_SECONDS,
                          lambda: layer.send(layer.DASHBOARD_GROUP, "dashboard.update"))


async def wake_scheduler_async(states: bool = False) -> None:
    """hub().wake_scheduler, for callers that hold no hub."""
    await hub().wake_scheduler(states)


def wake_scheduler() -> None:
    """wake_scheduler_async for sync callers."""
    async_to_sync(wake_scheduler_async)()
