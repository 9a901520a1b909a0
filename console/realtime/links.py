"""The agent links this console process holds, by host: a desired-state push for one of them is handed to it
directly instead of through the channel layer.

Why: through Redis a push is a group_send of four round trips, and the receiving process then pops its messages
one round trip at a time, so a pass that changed 100 hosts reached the last of them 0.75 s after its commit (and
1,000 hosts many seconds), on an event loop that every agent message also needs. A link held here costs a
function call. Hosts whose links are in another process (or in none) are named in one channel-layer message per
push (console/realtime/pushes.py); in the moment a newer link elsewhere supersedes one held here, a push may
reach only the old link, and the new one then has what its hello read, or the resend of a push not acknowledged
(console/control/loop.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from console.realtime.perloop import for_this_loop


class Link(Protocol):
    async def desired_push(self, event: dict) -> None: ...


_held: dict[asyncio.AbstractEventLoop, dict[int, Link]] = {}
# Per loop: host -> (the generation its link here was sent, when), until an ack covers it or the link ends; in the
# order sent, so the pushes no longer due (ACK_EXPECTED_SECONDS) are the oldest and the newest entry is the last.
_unanswered: dict[asyncio.AbstractEventLoop, dict[int, tuple[int, float]]] = {}
log = logging.getLogger("modelgrid.realtime")


@dataclass
class _Passes:
    begun: int = 0  # scheduler passes begun on this loop (planning)
    ended: int = 0  # and ended
    since: float = float("-inf")  # time.monotonic() when the last one began
    sent: float = float("-inf")  # when a link here last sent a push
    pushed: float = float("-inf")  # when the last pass that sent pushes ended


_passes: dict[asyncio.AbstractEventLoop, _Passes] = {}  # per loop: its scheduler passes, and when it last pushed
# A push this long without its ack no longer counts as due (its agent hung, or the ack was lost): the resend of
# pushes not acknowledged repairs it, and nothing here should wait on it meanwhile.
ACK_EXPECTED_SECONDS = 2.0
# A pass is waited for (after_acks) at most this long after it began: one whose pushes cannot be handed over (an
# agent that stopped reading, the channel layer down) must not hold intake's readings back with it. At 1,000 hosts
# a pass takes 1.5-4 s here.
PASS_WAIT_SECONDS = 10.0


def _links() -> dict[int, Link]:
    return for_this_loop(_held, dict)


def hold(host_id: int, link: Link) -> None:
    """`link` is now this process's link of the host (its newest hello here)."""
    _links()[host_id] = link


def release(host_id: int, link: Link) -> None:
    """`link` ended; a newer link of the host held here stays."""
    links = _links()
    if links.get(host_id) is link:
        del links[host_id]
        _due().pop(host_id, None)


def _due() -> dict[int, tuple[int, float]]:
    return for_this_loop(_unanswered, dict)


def sent(host_id: int, generation: int) -> None:
    """The host's link here sent its agent `generation`: an ack is due."""
    due, now = _due(), time.monotonic()
    due.pop(host_id, None)  # to the end: the entries stay in the order sent
    due[host_id] = generation, now
    for_this_loop(_passes, _Passes).sent = now


def acknowledged(host_id: int, generation: int) -> None:
    """The host's agent acknowledged `generation` (read here, not applied yet)."""
    due = _due()
    if host_id in due and due[host_id][0] <= generation:
        del due[host_id]


def acks_due() -> int:
    """How many pushes sent from here in the last ACK_EXPECTED_SECONDS are still waiting for their ack (for tests
    and diagnostics: the waits ask _any_due, which reads only the newest)."""
    since, count = time.monotonic() - ACK_EXPECTED_SECONDS, 0
    for _, at in reversed(_due().values()):
        if at < since:
            break  # this one and every older one are no longer due
        count += 1
    return count


def _any_due() -> bool:
    """acks_due() > 0, from the newest entry alone: polled every 10 ms through a wave of a thousand pushes."""
    due = _due()
    return bool(due) and next(reversed(due.values()))[1] >= time.monotonic() - ACK_EXPECTED_SECONDS


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """A scheduler pass is under way on this event loop, from before it plans until its pushes are handed over:
    after_acks waits for it. The pass's commit sends a wave at once (a push to each of a thousand hosts in a
    rollout). Intake's readings that began during a pass took the interpreter from it, and those that reached the
    replica rows it had locked to write waited there and then ran on into that wave the moment it committed: up to
    0.6 s of a thread sharing the interpreter lock with the event loop that sends the pushes and reads the acks (a
    throwaway trace, docs/benchmarks.md)."""
    passes = for_this_loop(_passes, _Passes)
    passes.begun += 1
    passes.since = began = time.monotonic()
    try:
        yield
    finally:
        passes.ended += 1
        if passes.sent >= began:  # it pushed: the acks' bound counts from here (after_acks)
            passes.pushed = time.monotonic()


def planning_now() -> bool:
    """Whether a scheduler pass is under way on this event loop (planning), for tests and diagnostics: after_acks
    reads the counts itself, to wait only for the passes under way when it was called."""
    passes = for_this_loop(_passes, _Passes)
    return passes.ended < passes.begun


async def after_acks(since: float, limit: float) -> None:
    """Until the scheduler passes under way here when called have ended (planning; each waited for at most
    PASS_WAIT_SECONDS after it began) and no acks are due here (acks_due), or, for the acks, `limit` seconds after
    `since` (time.monotonic()) or after the last pass here that pushed ended, whichever is later: how work that can
    wait (intake's readings, the leader's chores) lets a pass and its wave of pushes be sent and answered first, on
    the one interpreter the event loop shares with it. A pass begun after the call is not waited for. In a
    1,000-host rollout, passes seconds long, readings are applied seconds later for it."""
    passes = for_this_loop(_passes, _Passes)
    under_way = passes.begun
    while ((passes.ended < under_way and time.monotonic() - passes.since < PASS_WAIT_SECONDS)
           or (_any_due() and time.monotonic() - max(since, passes.pushed) < limit)):
        await asyncio.sleep(0.01)


def held(host_id: int) -> Link | None:
    return _links().get(host_id)


async def push(host_id: int, state: tuple[int, str] | None = None) -> None:
    """Hand the host's link held here (if any) its desired state: `state` (generation, the replicas' JSON text),
    else the one stored, read by the link."""
    link = held(host_id)
    if link is None:
        return
    event: dict = {"type": "desired.push"}
    if state is not None:
        event["generation"], event["replicas_json"] = state
    try:
        await link.desired_push(event)
    except Exception as e:  # its socket just closed, say: the agent's reconnect gets the state anyway
        log.warning("push to host %s's link lost (%s: %s)", host_id, type(e).__name__, e)
