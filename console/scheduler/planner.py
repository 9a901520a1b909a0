"""The planner: one pass from a PlanInput to a Plan.

1. Scale decisions set each deployment's target count; units are built in priority classes (units.py).
   The replicas of an idle deployment (scale to zero) are not placed: the ready ones leave their GPUs.
2. Existing ready replicas stay where they are if they still fit (stability); the rest are displaced. A
   deployment with requests waiting and none ready gets one replica in a demand class (demand.py).
3. Class by class (min replicas critical..batch, SLO replicas, extras, batch leftovers): the strategy
   places each unit, largest first; memory-optimized then repacks the class to place more; what still
   fails is repaired by one move, by preempting lower tiers (min and SLO classes) or by a temporal
   swap (extras); a replica placed for requests waiting at the gateway (demand.py) by preempting lower
   tiers or putting idle replicas of its tier to sleep.
4. A final round repeats the repairs until nothing changes, so re-planning the result moves nothing.
5. outcome.py turns the units into actions, states, MPS percentages and reasons.

The pass's state is one run.Run: the phases here decide, and change it only through its methods. Where a replica
may go is the placer's (strategies.py) under the pass's constraints (constraints.py).

The only clock read is time.perf_counter: for the improvement search's deadline and for elapsed_ms.
The cyclic garbage collector is paused while a pass runs (see _collector_paused).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from time import perf_counter

from console.scheduler.demand import demand_for
from console.scheduler.outcome import assemble
from console.scheduler.preemption import preempt_for, swap_for
from console.scheduler.repair import one_move, repack_class
from console.scheduler.run import Run
from console.scheduler.spread import crowded
from console.scheduler.types import Plan, PlanInput
from console.scheduler.units import EXTRA_CLASS, IDLE_CLASS, Unit

DEMAND_CLASSES = 4  # classes 4-7: SLO additions and waiting requests, critical..batch

SETTLE_ROUNDS = 20


def plan(request: PlanInput) -> Plan:
    """Place, keep, move, preempt, sleep or refuse every replica of `request`, each with its reason."""
    started = perf_counter()
    with _collector_paused():
        run = Run(request, started)
        try:
            run.keep_existing()
            for d in run.demanded:
                run.lift(d)
            place_classes(run)
            settle(run)
            spread_out(run)
            return assemble(run, elapsed_ms=1000 * (perf_counter() - started))
        finally:
            run.close()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one pass: a pass allocates some 100,000 short-lived objects,
    and the full collections they trigger over a large process (the console's) cost 20-40 ms of a 10,000-
    replica re-plan. Reference counting still frees everything; the collector resumes afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def order(run: Run, u: Unit) -> tuple:
    """Greedy order within a class: largest first (gangs before single GPUs); extras by value first."""
    size = (-u.width, -u.share, u.demand.name, u.index)
    if u.klass >= EXTRA_CLASS:
        return (-u.demand.value,) + size
    if run.placer.name == "latency-sensitive":
        size = (not u.demand.lc,) + size
    if u.klass >= DEMAND_CLASSES:
        # Waiting requests before SLO additions of the same tier, the longest-waiting demand first: by
        # name, one deployment would win every contested GPU and another's requests would starve.
        if u.phase == "demand":
            since = u.demand.dep.demand_since
            return (0, float("inf") if since is None else since) + size
        return (1, 0.0) + size
    return size


def place_classes(run: Run) -> None:
    """Class by class, most important first: place each replica, repack (memory-optimized), repair what failed."""
    by_class: dict[int, list[Unit]] = {}
    for u in run.wanted:
        if u.state != "ready" and u.klass != IDLE_CLASS:
            by_class.setdefault(u.klass, []).append(u)
    key = partial(order, run)
    for klass in sorted(by_class):
        units = sorted(by_class[klass], key=key)
        failed = [u for u in units if not try_place(run, u)]
        if failed and run.placer.name == "memory-optimized":
            members = [u for u in run.wanted if u.klass == klass]
            failed = repack_class(run, members, failed)
        run.retry_later(failed)
        if any(u.phase == "demand" for u in failed):  # the repack may have reordered them
            failed = sorted(failed, key=key)
        for u in failed:
            if u.state != "ready":
                repair(run, u)


def try_place(run: Run, u: Unit) -> bool:
    """Place `u` where the strategy says, waking a sleeping replica on its own host when it can."""
    if u.asleep and u.home in run.ledger.host_gpus:
        found = run.placer.choose(u, only_host=u.home)
        if found:
            run.place(u, *found)
            return True
    found = run.placer.choose(u)
    if found:
        run.place(u, *found)
        return True
    return False


def repair(run: Run, u: Unit) -> bool:
    """Place `u` by a plain fit, one move, preemption (min and SLO classes), demand eviction (demand) or a
    temporal swap (extras)."""
    # Placements only take room (and give lower-tier victims exactly the room they take), so what
    # failed cannot succeed until something is released: skip the attempt until then, for this replica
    # and for every other replica of its deployment in the same class (they are alike).
    alike = (id(u.demand), u.phase, u.share)
    if run.repairs_failed.failed(alike):
        return False
    if _repair(run, u):
        return True
    run.repairs_failed.note(alike)
    return False


def _repair(run: Run, u: Unit) -> bool:
    if try_place(run, u):
        return True
    if run.moves_left > 0 and one_move(run, u):
        return True
    if not run.settings.preempt:
        return False
    phase = u.phase
    if phase == "demand":
        if demand_for(run, u):
            return True
        # Once its deployment has a replica ready, the next pass plans it in its own phase (an SLO or extra
        # replica) with that phase's repairs: it gets them here too, or re-planning this result would move.
        if not u.demand.ready:
            return False
        phase = u.demand.rest_phase
    if phase in ("min", "slo"):
        return preempt_for(run, u, phase)
    return swap_for(run, u)


def settle(run: Run) -> None:
    """Repeat the repairs until no failed replica can be placed any more."""
    def key(u: Unit) -> tuple:
        return (u.klass, order(run, u))

    for _ in range(SETTLE_ROUNDS):
        progress = False
        for u in run.retries(key):
            if u.state != "ready" and repair(run, u):
                progress = True
        if not progress:
            break


def spread_out(run: Run) -> None:
    """Replicas placed in this pass that share a GPU with another of their deployment go where they are more
    apart, now that the pass is done: the improvement search packs without regard to spread, and evictions
    after a placement may have made room. Under required spread one that cannot move is not placed."""
    for demand in run.demands.values():
        if demand.dep.spread == "none" or demand.width > 1 or demand.ready < 2:
            continue
        for u in demand.members:
            if u.state != "ready" or u.fixed or u.asleep or not crowded(u):
                continue
            (g,), reason = u.gpus, u.reason
            run.take_off(u)
            found = run.placer.choose(u)
            if found is not None and found[0][0] != g and not crowded(u, found[0][0]):
                run.place(u, *found)
            elif demand.dep.spread != "required":
                run.put_back(u, g, reason)
