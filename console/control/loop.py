"""The scheduler loop: while this process leads the scheduler, run a reconcile pass whenever something changed (and
every MODELGRID_SCHEDULER_INTERVAL seconds), push changed hosts, refresh dashboards; while another leads, try
again every MODELGRID_LEADER_RETRY_SECONDS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from channels.db import database_sync_to_async
from django.conf import settings

from console.alerts.webhooks import deliver
from console.control.chores import CHORE_SECONDS, run_chores
from console.control.hub import hub, refresh_dashboards
from console.control.layer import SCHEDULER_GROUP, listen, refresh_gateways
from console.control.leader import Elector, NotLeader, current_leader
from console.control.reconcile import PassResult, Scope, reconcile_once, start_leading
from console.dbthreads import own_thread
from console.gateway.metrics import METRICS

log = logging.getLogger("modelgrid.scheduler")
PASS_REST = 2.0
IDLE_REST = 10.0  # with nothing to wake it, a pass comes no sooner than this many times the last one's CPU time


RESEND_SECONDS = 10.0  # a host still behind its generation this long after its push is pushed again
CHORES_WAIT_SECONDS = 2.0


async def run_pass(fence: Callable[[], None] | None = None, pushed: dict[int, float] | None = None,
                   scope: Scope = "plan") -> PassResult:
    """One unit of work. `fence` aborts the pass (NotLeader) before it writes. `pushed` (host -> when its
    desired state was last pushed) lets a push that was lost (the channel layer failed it, the link dropped
    it) be repaired: a host that has not acknowledged its generation RESEND_SECONDS after is pushed again. `scope`
    is reconcile_once's: "tick" and "states" plan nothing unless a lease or an eviction changed something."""
    here = hub()
    with here.planning():  # until its pushes are handed over: readings and chores wait (Hub.after_acks)
        began = time.perf_counter()
        result = await database_sync_to_async(reconcile_once)(fence, scope)
        took = time.perf_counter() - began
        now, pushed = time.monotonic(), {} if pushed is None else pushed
        hosts = set(result.changed_hosts)
        for host in result.behind:  # first seen behind now: its push may still be on its way
            if now - pushed.setdefault(host, now) >= RESEND_SECONDS:
                hosts.add(host)
        if hosts:
            await here.push_desired(sorted(hosts), result.states)
            pushed.update(dict.fromkeys(hosts, now))
    if result.planned:
        METRICS.pass_seconds.observe(took)
    for action in result.actions:
        METRICS.actions.labels(action).inc()
    for tier in result.refused:
        METRICS.refused.labels(tier).inc()
    for tier in result.preempted:
        METRICS.preemptions.labels(tier).inc()
    if result.actions or hosts:
        log.info("pass: %d action(s) in %.2f s (%.2f s of CPU); %d host(s) pushed in %.2f s", len(result.actions),
                 took, result.cpu_s, len(hosts), time.perf_counter() - began - took)
    for gone in set(pushed) - set(result.behind) - hosts:  # acknowledged: nothing to repair
        del pushed[gone]
    if result.changed:
        await refresh_gateways()  # demand answers and placements: waiting requests learn of them now
        await refresh_dashboards()
    return result


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
    """Passes until `stop` or until this process no longer leads: one as soon as something wakes the scheduler
    (a deployment changed, an agent reported a change: wake_scheduler), one after any pass that changed
    something (to see it through), and one every `interval` seconds regardless (the clock's own events: leases
    lapsing, idle replicas, demand going stale), which plans only when _replan_due says so and is otherwise a tick
    (leases and evictions). Only the leader listens for wake-ups: followers would let them pile up."""
    woken = asyncio.Event()
    restate = asyncio.Event()  # woken for replicas' states alone: the deployments' states follow, nothing to plan
    pushed: dict[int, float] = {}  # host -> when its desired state was last pushed (while not acknowledged)
    joined = asyncio.Event()
    listening = asyncio.create_task(listen(SCHEDULER_GROUP, lambda m: (restate if m.get("states") else woken).set(),
                                           joined.set))
    await joined.wait()  # wake-ups sent from now on are heard (with Redis down, the resync pass is the net)
    loop = asyncio.get_running_loop()
    ended, rest, cpu = float("-inf"), 0.0, 0.0
    last_plan: PassResult | None = None  # the last pass that planned, and when (loop time)
    planned_at = float("-inf")
    chores = asyncio.create_task(_chore_loop(elector, stop))
    with hub().waking_here(lambda states: (restate if states else woken).set()):  # wake-ups from this process
        try:
            while not stop.is_set():
                # Unwoken, passes use at most a tenth of a core: at 1,000 hosts one costs over a second.
                await _wait(ended + max(interval, IDLE_REST * cpu) - loop.time(), woken, restate, stop)
                # A big fleet's pass takes long: the next begins no sooner than PASS_REST times its CPU time after,
                # so passes use at most a third of a core however many wake-ups arrive meanwhile (they are all
                # answered by that one pass).
                await _wait(ended + rest - loop.time(), stop)
                if stop.is_set():
                    break
                why = "woken" if woken.is_set() else _replan_due(last_plan, loop.time() - planned_at)
                scope: Scope = "plan" if why else "states" if restate.is_set() else "tick"
                woken.clear()
                restate.clear()
                try:
                    result = await run_pass(elector.fence, pushed, scope=scope)
                except NotLeader as e:
                    log.warning("no longer leading the scheduler: %s", e)
                    return
                except Exception:  # one bad pass must not end the loop; the next pass retries
                    log.exception("scheduler pass failed")
                    result, last_plan = PassResult(changed_hosts=(), changed=False, planned=False), None
                # By its CPU time: a pass slowed by a busy process (waiting for the GIL, for rows intake holds) cost
                # the database thread little, and resting for its wall time would only delay the next one.
                ended, cpu = loop.time(), result.cpu_s
                rest = PASS_REST * cpu
                if result.planned:
                    last_plan, planned_at = result, ended
                log.debug("%s: %.3f s of CPU", f"pass ({why or 'a lease or an eviction'})" if result.planned else scope,
                          cpu)
                if result.replanned:  # a pass that changed what it plans with or placed: another sees it through
                    woken.set()
        finally:
            for task in (listening, chores):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def _replan_due(last: PassResult | None, since: float) -> str:
    """Why a pass nothing woke must plan ("" when it need not): none has yet, the clock turns one of the planner's
    rules (an idle timeout, a residency, a cooldown), a deployment has traffic (its figures change without a
    wake-up: the SLO loop looks at them every interval), or the last plan is MODELGRID_SCHEDULER_RESYNC_SECONDS old
    (the safety net: a wake-up lost, a row changed behind the console's back). Anything else that changes wakes
    the scheduler."""
    if last is None:
        return "the first"
    if last.busy:
        return "traffic"
    if since >= settings.MODELGRID_SCHEDULER_RESYNC_SECONDS:
        return "resync"
    if last.recheck_at is not None and time.time() >= last.recheck_at:
        return "a time rule turns"
    return ""


async def _chore_loop(elector: Elector, stop: asyncio.Event) -> None:
    """The leader's chores (console/control/chores.py) every CHORE_SECONDS, each after a check that it still leads."""
    while not stop.is_set():
        try:
            # Chores can wait a little: while a pass runs here, and then while its wave of pushes waits for its acks
            # (up to CHORES_WAIT_SECONDS), they come after, off the interpreter the event loop needs meanwhile.
            await hub().after_acks(time.monotonic(), CHORES_WAIT_SECONDS)
            # A thread of its own on PostgreSQL: chores take a while at fleet scale, and must not hold up intake
            # and requests on Channels' one database thread. They write only their own rows (series, alerts,
            # events), so they cannot deadlock with a pass.
            await own_thread(_fenced_chores)(elector)
            await deliver(own_thread)
        except NotLeader:
            return
        except Exception:
            log.exception("chores failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CHORE_SECONDS)


def _fenced_chores(elector: Elector) -> None:
    # Not the pass's fence: that locks the epoch's row, which a pass holds for all its transaction (over a second
    # at 10,000 replicas), and a chore waiting there held a database thread the intake and the pushes share.
    elector.check()
    run_chores()


async def _wait(timeout: float, *events: asyncio.Event) -> None:
    """Until one of `events` is set, or `timeout` seconds have passed."""
    if timeout <= 0 or any(e.is_set() for e in events):
        return
    waits = {asyncio.ensure_future(e.wait()) for e in events}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


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
