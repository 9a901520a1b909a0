"""The state of one planning pass, and every change to it.

A Run holds what a pass works on: the ledger of reservations, the units (replicas) and their deployments, the
move budget left, the replicas to retry, the improvement search's report. Only its methods change it, each named
for what it does. The planner's phases and the modules that pick victims or moves (demand.py, preemption.py,
repair.py) decide, then call these to act; outcome.py reads a finished run.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from operator import gt
from typing import TypeVar

from console.scheduler import explain
from console.scheduler.constraints import for_pass
from console.scheduler.demand import to_lift
from console.scheduler.index import IndexBook
from console.scheduler.ledger import Ledger
from console.scheduler.scaling import decide
from console.scheduler.strategies import make_placer
from console.scheduler.types import PlanInput, SearchReport, host_of
from console.scheduler.units import IDLE_CLASS, Demand, Unit, build_units

T = TypeVar("T")


class FailureMemo:
    """What failed, keyed by what makes attempts alike, at the ledger's release count: placements only take room,
    so an attempt that failed fails again until something is released."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.at: dict[Hashable, int] = {}

    def failed(self, key: Hashable) -> bool:
        """Whether an attempt like `key` failed since the last release."""
        return self.at.get(key) == self.ledger.releases

    def note(self, key: Hashable) -> None:
        """An attempt like `key` failed now."""
        self.at[key] = self.ledger.releases


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
        self.placer = make_placer(request.strategy, self.ledger, self.book,
                                  for_pass(request.strategy, request.constraints))
        self.decisions = {d.name: decide(d, request.now, request.settings) for d in request.deployments}
        self.demands, self.wanted, self.retired, self.orphans = build_units(
            request.deployments, self.decisions, request.replicas, request.now, self.ledger, stale_hosts)
        self.demanded = [d for d in self.demands.values() if d.units is not None]  # deployments with requests waiting
        self.ram = {h.name: h.ram_free_bytes for h in request.hosts if h.name not in stale_hosts}
        limit = request.settings.max_moves
        self.moves_left = float("inf") if limit is None else limit
        self.failed: list[Unit] = []  # replicas to retry (planner.settle)
        self.repairs_failed = FailureMemo(self.ledger)  # alike replicas (planner.repair)
        self.demands_failed = FailureMemo(self.ledger)  # demand shapes (demand.demand_for)
        self.search: SearchReport | None = None
        self._once: dict[str, object] = {}

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

    def once(self, name: str, build: Callable[[], T]) -> T:
        """What `build()` returns, built at the first call of the pass under `name`."""
        found = self._once.get(name)
        if found is None:
            found = self._once[name] = build()
        return found  # type: ignore[return-value]

    # --- the starting point -----------------------------------------------------------------------

    def keep_existing(self) -> None:
        """Reserve existing ready replicas where they are; where a GPU no longer holds all of its replicas,
        the most important ones stay and the rest are displaced."""
        ledger = self.ledger
        number, capacity, reserved = ledger.number, ledger.capacity, ledger.reserved
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
            for u in ledger.take_back(g):
                u.demand.ready -= 1
                u.gpus, u.fixed, u.state = (), False, "pending"  # not placed
                rest.append(u)
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

    def lift(self, d: Demand) -> None:
        """Put one replica of `d` in phase "demand" (demand.to_lift says which, if any)."""
        unit = to_lift(d)
        if unit is not None:
            unit.phase, unit.klass = "demand", 4 + d.rank

    # --- placements -------------------------------------------------------------------------------

    def place(self, u: Unit, gpus: tuple[int, ...], note: str) -> None:
        """Reserve `gpus` for `u` and write down where and why."""
        ledger = self.ledger
        before = [ledger.free(g) for g in gpus]
        ledger.reserve(u, gpus)
        u.state = "ready"
        u.demand.ready += 1
        u.reason = explain.placed(note, u.share, u.width, [ledger.ids[g] for g in gpus], before)

    def put_back(self, u: Unit, g: int, reason: str) -> None:
        """Return `u`, just taken off GPU g, to it with the reason it had."""
        self.ledger.reserve(u, (g,))
        u.state, u.reason = "ready", reason
        u.demand.ready += 1

    def take_off(self, u: Unit) -> None:
        """Take `u` off its GPUs; where it ends up is decided anew."""
        self.ledger.release(u)
        u.demand.ready -= 1
        u.state = "pending"
        u.relocated = u.fixed  # a kept replica taken off its GPUs: where it ends up is decided anew

    def relocate(self, mover: Unit, gpus: tuple[int, ...], note: str, beneficiary: Unit) -> None:
        """Move a placed replica to `gpus` to make room for `beneficiary`, spending a move if it was kept."""
        if mover.fixed:
            self.moves_left -= 1
        self.take_off(mover)
        self.place(mover, gpus, note)
        mover.moved_by = (f"to make room for {beneficiary.named_for(mover)} ({beneficiary.demand.tier}), which fits "
                          "nowhere else")

    def evict(self, victim: Unit, kind: str, cause: str, by: Unit) -> None:
        """Take a replica off its GPUs (preempted or put to sleep); it may still be placed elsewhere."""
        self.take_off(victim)
        victim.cause, victim.cause_kind, victim.evictor = cause, kind, by
        self.failed.append(victim)
        if victim.demand.units is not None and not victim.demand.ready:  # requests wait and none is ready now
            self.lift(victim.demand)

    # --- bookkeeping ------------------------------------------------------------------------------

    def retry_later(self, units: list[Unit]) -> None:
        """`units` found no place: the final rounds try them again."""
        self.failed.extend(units)

    def retries(self, key: Callable[[Unit], tuple]) -> list[Unit]:
        """The replicas to retry that are still not placed, once each, in `key` order; what is evicted while they
        are tried joins the next round."""
        pending = {id(u): u for u in self.failed if u.state != "ready"}
        self.failed = sorted(pending.values(), key=key)
        return list(self.failed)

    def record_search(self, iterations: int, placed_extra: int, stopped_by: str) -> None:
        """Add one class's improvement search to the pass's report."""
        previous = self.search
        self.search = SearchReport(
            iterations=iterations + (previous.iterations if previous else 0),
            placed_extra=placed_extra + (previous.placed_extra if previous else 0),
            stopped_by=stopped_by,
        )
