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

The only clock read is time.perf_counter: for the improvement search's deadline and for elapsed_ms.
The cyclic garbage collector is paused while a pass runs (see _collector_paused).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from operator import gt
from time import perf_counter

from console.scheduler import explain
from console.scheduler.demand import demand_for, lift, mark_demand
from console.scheduler.index import IndexBook
from console.scheduler.ledger import Ledger
from console.scheduler.outcome import assemble
from console.scheduler.preemption import preempt_for, swap_for
from console.scheduler.repair import one_move, repack_class
from console.scheduler.scaling import decide
from console.scheduler.spread import crowded
from console.scheduler.strategies import make_placer
from console.scheduler.types import Plan, PlanInput, SearchReport, host_of
from console.scheduler.units import EXTRA_CLASS, IDLE_CLASS, Demand, Unit, build_units

DEMAND_CLASSES = 4  # classes 4-7: SLO additions and waiting requests, critical..batch

SETTLE_ROUNDS = 20


def plan(request: PlanInput) -> Plan:
    """Place, keep, move, preempt, sleep or refuse every replica of `request`, each with its reason."""
    started = perf_counter()
    with _collector_paused():
        run = Run(request, started)
        try:
            run.keep_existing()
            run.demanded = mark_demand(run)
            run.place_classes()
            run.settle()
            run.spread_out()
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


class Run:
    """The mutable state of one planning pass."""

    def __init__(self, request: PlanInput, started: float) -> None:
        self.request = request
        self.settings = request.settings
        self.deadline = started + request.settings.search_budget_s
        # GPUs of hosts whose readings are stale are not in the ledger: nothing is placed there or taken from there,
        # and their replicas are held as they are (units.build_units, outcome.assemble).
        self.stale = tuple(g for g in request.gpus if g.stale)
        stale_hosts = frozenset(g.host for g in self.stale)
        gpus = [g for g in request.gpus if not g.stale] if self.stale else request.gpus
        self.ledger = Ledger(gpus, request.buffer_bytes)
        self.book = IndexBook(self.ledger)
        self.placer = make_placer(request.strategy, self.ledger, self.book)
        self.decisions = {d.name: decide(d, request.now, request.settings) for d in request.deployments}
        self.demands, self.wanted, self.retired, self.orphans = build_units(
            request.deployments, self.decisions, request.replicas, request.now, self.ledger, stale_hosts)
        self.ram = {h.name: h.ram_free_bytes for h in request.hosts if h.name not in stale_hosts}
        limit = request.settings.max_moves
        self.moves_left = float("inf") if limit is None else limit
        self.failed: list[Unit] = []
        self.failed_at: dict[tuple, int] = {}  # alike replicas -> ledger release count at their last failure
        self.search: SearchReport | None = None
        self.demanded: list[Demand] = []  # deployments with requests waiting (mark_demand)
        self.demand_failed: dict[tuple, int] = {}  # demand shape -> ledger release count at its last failure
        self.demand_victims: list[Unit] | None = None  # what demand may evict in this pass (demand.py)
        self.lowest_ready_rank: int | None = None  # for refusal reasons, on the final ledger (outcome.py)

    def close(self) -> None:
        """Break the run's reference cycles once its plan is assembled (the plan holds none of its objects): the
        indexes listen to the ledger, the placer's keys hold the placer that holds the indexes, and each demand
        lists the units that point back to it. Unhooked, the pass's 10,000 units are freed by reference counting
        as plan() returns, instead of waiting for a collection of the console's heap, which every thread waits
        for (docs/benchmarks.md)."""
        self.ledger.close()
        self.book.close()
        for demand in self.demands.values():
            demand.members, demand.units = [], None

    # --- stability --------------------------------------------------------------------------------

    def keep_existing(self) -> None:
        """Reserve existing ready replicas where they are; where a GPU no longer holds all of its replicas,
        the most important ones stay and the rest are displaced."""
        ledger = self.ledger
        number, capacity, reserved = ledger.number, ledger.capacity, ledger.reserved
        holders, tier_bytes, host, host_ready = ledger.holders, ledger.tier_bytes, ledger.host, ledger.host_ready
        # Most replicas of a re-plan (alone on one GPU that still exists, no selector) were reserved as their units
        # were built (units._existing_units); they are taken back below from the rare GPU that cannot hold all it
        # held. The others (gangs, selectors, GPUs gone) are kept or displaced here, the most important first.
        rest = [u for u in self.wanted if u.origin and not u.fixed and u.klass != IDLE_CLASS]
        load: dict[int, int] = {}  # what the others held, per GPU that still exists
        for u in rest:
            for gpu in u.origin:
                g = number.get(gpu)
                if g is not None:
                    load[g] = load.get(g, 0) + u.share
        crowded = [g for g, over in enumerate(map(gt, reserved, capacity)) if over]
        crowded += [g for g, need in load.items() if reserved[g] <= capacity[g] < reserved[g] + need]
        for g in crowded:  # order matters only on crowded GPUs: their replicas join the sorted ones
            for u in holders[g]:
                demand = u.demand
                tier_bytes[g][demand.rank] -= u.share
                host_ready[host[g]] -= 1
                demand.ready -= 1
                u.gpus, u.fixed, u.state = (), False, "pending"  # not placed
                rest.append(u)
            holders[g] = []
            reserved[g] = 0
        rest.sort(key=lambda u: (u.klass, -u.demand.value, u.demand.name, u.index))
        for u in rest:
            cause = self._why_not_kept(u)
            if cause:
                u.cause, u.cause_kind = cause, "displaced"
                continue
            ledger.reserve(u, [number[i] for i in u.origin])
            u.fixed, u.state = True, "ready"
            u.demand.ready += 1

    def _why_not_kept(self, u: Unit) -> str:
        ledger = self.ledger
        for gpu in u.origin:
            if gpu not in ledger.number:
                host = host_of(gpu)
                return f"host {host} is gone" if host not in ledger.host_gpus else f"GPU {gpu} is gone"
        numbers = [ledger.number[i] for i in u.origin]
        if len(numbers) != u.width:
            return f"it now needs {u.width} GPUs, not {len(numbers)}"
        if len({ledger.host[g] for g in numbers}) > 1:
            return "its GPUs are on different hosts"
        allowed = ledger.eligible_set(u.demand.key)
        for g in numbers:
            if g not in allowed:
                return f"{ledger.ids[g]} no longer matches its selector {explain.selector_text(u.demand.dep.selector)}"
        for g in numbers:
            if ledger.free(g) < u.share:
                gpu = ledger.gpus[g]
                return (f"{ledger.ids[g]} no longer has room for its {explain.gib(u.share)}: "
                        f"{explain.gib(max(ledger.free(g), 0))} free with {explain.gib(gpu.used_bytes)} "
                        "used by other processes")
        return ""

    # --- placement --------------------------------------------------------------------------------

    def order(self, u: Unit) -> tuple:
        """Greedy order within a class: largest first (gangs before single GPUs); extras by value first."""
        size = (-u.width, -u.share, u.demand.name, u.index)
        if u.klass >= EXTRA_CLASS:
            return (-u.demand.value,) + size
        if self.placer.name == "latency-sensitive":
            size = (not u.demand.lc,) + size
        if u.klass >= DEMAND_CLASSES:
            # Waiting requests before SLO additions of the same tier, the longest-waiting demand first: by
            # name, one deployment would win every contested GPU and another's requests would starve.
            if u.phase == "demand":
                since = u.demand.dep.demand_since
                return (0, float("inf") if since is None else since) + size
            return (1, 0.0) + size
        return size

    def place_classes(self) -> None:
        by_class: dict[int, list[Unit]] = {}
        for u in self.wanted:
            if u.state != "ready" and u.klass != IDLE_CLASS:
                by_class.setdefault(u.klass, []).append(u)
        for klass in sorted(by_class):
            units = sorted(by_class[klass], key=self.order)
            failed = [u for u in units if not self.try_place(u)]
            if failed and self.placer.name == "memory-optimized":
                members = [u for u in self.wanted if u.klass == klass]
                failed = repack_class(self, members, failed)
            self.failed.extend(failed)
            if any(u.phase == "demand" for u in failed):  # the repack may have reordered them
                failed = sorted(failed, key=self.order)
            for u in failed:
                if u.state != "ready":
                    self.repair(u)

    def try_place(self, u: Unit) -> bool:
        """Place `u` where the strategy says, waking a sleeping replica on its own host when it can."""
        if u.asleep and u.home in self.ledger.host_gpus:
            found = self.placer.choose(u, only_host=u.home)
            if found:
                self.place(u, *found)
                return True
        found = self.placer.choose(u)
        if found:
            self.place(u, *found)
            return True
        return False

    def repair(self, u: Unit) -> bool:
        """Place `u` by a plain fit, one move, preemption (min and SLO classes), demand eviction (demand) or a
        temporal swap (extras)."""
        # Placements only take room (and give lower-tier victims exactly the room they take), so what
        # failed cannot succeed until something is released: skip the attempt until then, for this replica
        # and for every other replica of its deployment in the same class (they are alike).
        alike = (id(u.demand), u.phase, u.share)
        if self.failed_at.get(alike) == self.ledger.releases:
            return False
        if self._repair(u):
            return True
        self.failed_at[alike] = self.ledger.releases
        return False

    def _repair(self, u: Unit) -> bool:
        if self.try_place(u):
            return True
        if self.moves_left > 0 and one_move(self, u):
            return True
        if not self.settings.preempt:
            return False
        phase = u.phase
        if phase == "demand":
            if demand_for(self, u):
                return True
            # Once its deployment has a replica ready, the next pass plans it in its own phase (an SLO or extra
            # replica) with that phase's repairs: it gets them here too, or re-planning this result would move.
            if not u.demand.ready:
                return False
            phase = u.demand.rest_phase
        if phase in ("min", "slo"):
            return preempt_for(self, u, phase)
        return swap_for(self, u)

    def settle(self) -> None:
        """Repeat the repairs until no failed replica can be placed any more."""
        for _ in range(SETTLE_ROUNDS):
            pending = {id(u): u for u in self.failed if u.state != "ready"}
            self.failed = sorted(pending.values(), key=lambda u: (u.klass, self.order(u)))
            progress = False
            for u in list(self.failed):
                if u.state != "ready" and self.repair(u):
                    progress = True
            if not progress:
                break
        self.failed = [u for u in self.failed if u.state != "ready"]

    def spread_out(self) -> None:
        """Replicas placed in this pass that share a GPU with another of their deployment go where they are more
        apart, now that the pass is done: the improvement search packs without regard to spread, and evictions
        after a placement may have made room. Under required spread one that cannot move is not placed."""
        for demand in self.demands.values():
            if demand.dep.spread == "none" or demand.width > 1 or demand.ready < 2:
                continue
            for u in demand.members:
                if u.state != "ready" or u.fixed or u.asleep or not crowded(u):
                    continue
                (g,), reason = u.gpus, u.reason
                self._unreserve(u)
                found = self.placer.choose(u)
                if found is not None and found[0][0] != g and not crowded(u, found[0][0]):
                    self.place(u, *found)
                elif demand.dep.spread == "required":
                    self.failed.append(u)
                else:
                    self.ledger.reserve(u, (g,))
                    u.state, u.reason = "ready", reason
                    demand.ready += 1

    # --- changes ----------------------------------------------------------------------------------

    def place(self, u: Unit, gpus: tuple[int, ...], note: str) -> None:
        """Reserve `gpus` for `u` and write down where and why."""
        ledger = self.ledger
        before = [ledger.free(g) for g in gpus]
        ledger.reserve(u, gpus)
        u.state = "ready"
        u.demand.ready += 1
        u.reason = explain.placed(note, u.share, u.width, [ledger.ids[g] for g in gpus], before)

    def relocate(self, mover: Unit, gpus: tuple[int, ...], note: str, beneficiary: Unit) -> None:
        """Move a placed replica to `gpus` to make room for `beneficiary`."""
        self._unreserve(mover)
        self.place(mover, gpus, note)
        mover.moved_by = (f"to make room for {beneficiary.named_for(mover)} ({beneficiary.demand.tier}), which fits "
                          "nowhere else")

    def evict(self, victim: Unit, kind: str, cause: str, by: Unit) -> None:
        """Take a replica off its GPUs (preempted or put to sleep); it may still be placed elsewhere."""
        self._unreserve(victim)
        victim.cause, victim.cause_kind, victim.evictor = cause, kind, by
        self.failed.append(victim)
        if victim.demand.units is not None and not victim.demand.ready:  # requests wait and none is ready now
            lift(victim.demand)

    def _unreserve(self, u: Unit) -> None:
        """Take `u` off its GPUs; where it ends up is decided anew."""
        self.ledger.release(u)
        u.demand.ready -= 1
        u.state = "pending"
        u.relocated = u.fixed  # a kept replica taken off its GPUs: where it ends up is decided anew
