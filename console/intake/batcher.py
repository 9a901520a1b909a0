"""Agent messages from every link of this console process, applied together: a link hands its messages over
(without waiting for each to be applied before reading the next); a single task takes whatever arrived during
one tick and applies it in two stages (console/intake/stages.py): hosts (leases, closed links, acks), then
readings (replicas' states, GPU readings, reports' host fields). Each stage takes its batches one after another
in arrival order, so each link's messages still apply in the order it sent them, and a thousand agents cost a few
statements per tick instead of a transaction each; the next batch's hosts need not wait for the last batch's
readings. The hosts stage's thread, once it commits a batch, takes the next one itself if it is due (an ack came
meanwhile) rather than handing back to the event loop and waiting to be handed it."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
import time

from django.conf import settings

from agent.protocol import Ack, HostReport
from console.control.hub import hub, refresh_dashboards, wake_scheduler_async
from console.control.layer import refresh_gateways
from console.dbthreads import dedicated_thread, own_thread
from console.intake import stages as intake
from console.perloop import for_this_loop

log = logging.getLogger("modelgrid.realtime")
# Each stage's batches run one after another, on a thread of its own (PostgreSQL): an ack must not wait for a free
# thread behind other work (console/dbthreads.py).
_HOSTS_THREAD = dedicated_thread("intake-hosts")
_READINGS_THREAD = dedicated_thread("intake-readings")
# How long the hosts stage's thread goes on taking batches that came due before it hands back to the event loop
# (on SQLite that thread is Channels' one database thread, which everything else needs too).
DRAIN_SECONDS = 0.5
# How long a batch's readings wait, at most, for the acks due to this process (console/control/hub.py), from when
# its hosts stage was done or the last pass here that pushed ended, whichever is later: see Batcher._finish.
READINGS_WAIT_SECONDS = 0.3


def quiet(message) -> bool:
    """A report that tells no replica's state: a lease renewal, or readings (GPUs, serving figures), which nothing
    waits for within a second; it can wait a while and share its batch. A busy host's readings move in every report:
    each at the tick was a batch and a scheduler pass per report."""
    return isinstance(message, HostReport) and not message.replicas


class Batcher:
    def __init__(self, tick: float, quiet_tick: float) -> None:
        self.tick = tick
        self.quiet_tick = quiet_tick
        # The pending batch: added to on the event loop, taken on the hosts stage's thread.
        self._lock = threading.Lock()
        self._pending: list[tuple[intake.Item, asyncio.Future]] = []
        self._due = math.inf  # when (time.monotonic) the pending batch is applied: a tick after its most urgent message
        self._sooner = asyncio.Event()  # a message came that makes the batch due sooner
        self._task: asyncio.Task | None = None
        # Batches whose first stage is done, waiting for their readings (in order, each with when it was staged),
        # and the task that applies them.
        self._staged: list[tuple[list[tuple[intake.Item, asyncio.Future]], intake.Staged, float]] = []
        self._readings: asyncio.Task | None = None
        self._leases = intake.LeaseChecks()  # whose leases this process looked at lately (hosts stage's thread)

    def enqueue(self, item: intake.Item) -> asyncio.Future:
        """Hand `item` over; the future gets its outcome once its batch is committed. A quiet report waits up to
        the quiet tick (a thousand quiet hosts then cost a few transactions a second, not fifty); an ack none (a push
        waits for it, and what comes while a batch is being applied gathers for the next anyway); any other message
        at most the tick. Each takes the messages waiting before it with it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        due = time.monotonic() + (0.0 if isinstance(item.message, Ack) else
                                  self.quiet_tick if quiet(item.message) else self.tick)
        with self._lock:
            self._pending.append((item, future))
            sooner = due < self._due
            if sooner:
                self._due = due
        if sooner:
            self._sooner.set()
        if self._task is None or self._task.done():  # the task ends when idle: nothing outlives the loop
            self._task = loop.create_task(self._run(), name="agent-intake")
        return future

    async def submit(self, item: intake.Item) -> intake.Outcome:
        return await self.enqueue(item)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # (The loop alone adds to _pending, and never awaits between this test and returning: a message enqueued
        # later finds the task done and starts another.)
        while self._pending:
            # The tick counts from each message's arrival: what arrived while the last batch was being applied
            # has waited long enough already.
            while (wait := self._due - time.monotonic()) > 0:
                self._sooner.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._sooner.wait()
            try:
                # Its own thread (PostgreSQL): a batch never waits for a scheduler pass to finish its turn.
                await own_thread(self._drain, _HOSTS_THREAD)(loop, contextvars.copy_context())
            except Exception as e:
                # The thread call failed (it could not start, or give its connection back): what waits fails rather
                # than wait for a call that may fail again.
                with self._lock:
                    batch, self._pending, self._due = self._pending, [], math.inf
                if batch:
                    self._fail(batch, e)
                else:  # after its batches were applied (giving a connection back, say)
                    log.error("intake's hosts stage failed after its batches: %s: %s", type(e).__name__, e)

    def _drain(self, loop: asyncio.AbstractEventLoop, context: contextvars.Context) -> None:
        """On the hosts stage's thread: apply the pending batch, then each next one that is due by the time the one
        before committed, for up to DRAIN_SECONDS. In a 1,000-host wave, handing each batch back to the event loop
        and being handed the next (the loop one of many threads that want the interpreter) took ~100 ms and up to
        1.5 s between an ack's batch and the one before it (a throwaway trace; docs/benchmarks.md)."""
        began = time.monotonic()
        while time.monotonic() - began < DRAIN_SECONDS:
            with self._lock:
                if not self._pending or self._due > time.monotonic():
                    return
                batch, self._pending, self._due = self._pending, [], math.inf
            try:
                staged = intake.apply_hosts([item for item, _ in batch], self._leases)
            except Exception as e:  # not even retried one by one (the database is gone, say)
                _to_loop(loop, context, self._fail, batch, e)
                continue
            _to_loop(loop, context, self._read, batch, staged)

    def _read(self, batch: list[tuple[intake.Item, asyncio.Future]], staged: intake.Staged) -> None:
        # The readings' stage on a task of its own: the next tick's acks and leases need not wait for this tick's
        # readings (those seldom touch host rows, and then last: see intake).
        self._staged.append((batch, staged, time.monotonic()))
        if self._readings is None or self._readings.done():
            self._readings = asyncio.get_running_loop().create_task(self._apply_readings(),
                                                                    name="agent-intake-readings")

    async def _apply_readings(self) -> None:
        """Every batch staged by the time the wait below ends, applied together, in order (each link's messages keep
        theirs): readings never fall behind by more than that wait and one application, however many batches came
        meanwhile. One application per batch, each waiting for a pass, fell behind by 20 s at 100 busy hosts."""
        while self._staged:
            # A pass and its acks first: while a scheduler pass runs here, and then while the pushes sent from here
            # wait for their acks (a wave of them, a pass having changed many hosts), the readings (replicas' states
            # and GPU readings, which nothing waits for within a second) hold back (Hub.after_acks: for the acks,
            # up to READINGS_WAIT_SECONDS). Applying them is most of intake's work, on a thread that shares the one
            # interpreter lock with the event loop that sends the pushes and reads the acks.
            await hub().after_acks(self._staged[0][2], READINGS_WAIT_SECONDS)
            taken, self._staged = self._staged, []
            batch, parts = [], []
            for pairs, staged, _ in taken:
                parts.append((len(batch), staged))
                batch += pairs
            await self._finish(batch, intake.Staged.joined(parts) if len(parts) > 1 else parts[0][1])

    async def _finish(self, batch: list[tuple[intake.Item, asyncio.Future]], staged: intake.Staged) -> None:
        try:
            outcomes = await own_thread(intake.apply_readings, _READINGS_THREAD)([item for item, _ in batch], staged)
        except Exception as e:
            self._fail(batch, e)
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if not future.done():  # its link may have gone meanwhile
                future.set_result(outcome)
        if any(o.news for o in outcomes):
            await wake_scheduler_async()  # the scheduler plans with what changed, now rather than at its tick
        elif any(o.observed for o in outcomes):
            await wake_scheduler_async(states=True)  # the deployments' states follow their replicas'
        if any(o.ready for o in outcomes):
            await refresh_gateways()  # a replica that became ready takes the requests waiting for it
        if any(o.observed for o in outcomes):
            await refresh_dashboards()

    @staticmethod
    def _fail(batch: list[tuple[intake.Item, asyncio.Future]], e: Exception) -> None:
        kinds = ", ".join(sorted({getattr(item.message, "type", "close") for item, _ in batch}))
        log.error("applying agent messages (%s) failed: %s: %s", kinds, type(e).__name__, e)
        for _, future in batch:
            if not future.done():
                future.set_result(intake.Outcome(error=f"the console could not apply this {kinds} "
                                                       f"({type(e).__name__}); its log has the details"))


def _to_loop(loop: asyncio.AbstractEventLoop, context: contextvars.Context, callback, *args) -> None:
    """Run `callback(*args)` on `loop`'s thread in `context` (the batcher task's, not this thread's: asgiref marks a
    database thread's context, and a task started in it would refuse to reach the database), in the order called.
    A closed loop's batches are moot."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args, context=context.copy())


_batchers: dict[asyncio.AbstractEventLoop, Batcher] = {}


def batcher() -> Batcher:
    """This event loop's batcher."""
    return for_this_loop(_batchers, lambda: Batcher(settings.MODELGRID_INTAKE_TICK_SECONDS,
                                                    settings.MODELGRID_INTAKE_QUIET_TICK_SECONDS))
