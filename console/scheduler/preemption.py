"""Taking room from less important replicas: priority preemption and temporal swaps.

Preemption (for replicas up to a minimum, or added for an SLO): victims are strictly lower tiers (and,
for a minimum, the same tier's extra replicas), never an equal or higher tier. Victims above their own
minimum go first, then the lowest tier, then the least traffic; the GPU (or host, for a gang) where the
cheapest set of victims makes room wins.

Temporal swap (for extra replicas when demand exceeds capacity): an extra replica whose tier-weighted
traffic per replica is at least twice another's, of the same or a lower tier, sends that one to sleep.
The factor of two keeps two similar replicas from trading places on every pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from console.scheduler.explain import preempted_by
from console.scheduler.units import TIER_WEIGHT, Unit

if TYPE_CHECKING:
    from console.scheduler.planner import Run

SWAP_FACTOR = 2.0
Cost = tuple[int, float, float, int, int]


def may_preempt(unit: Unit, victim: Unit) -> bool:
    """Whether `unit` outranks `victim` enough to take its room."""
    if victim.demand.rank > unit.demand.rank:
        return True
    return (unit.phase == "min" and victim.demand.rank == unit.demand.rank and victim.phase == "extra"
            and victim.demand is not unit.demand)


def preempt_for(run: Run, unit: Unit) -> bool:
    """Place `unit` by preempting lower-priority replicas; False when no set of them makes room."""
    why = unit.demand.why(unit.phase)
    cause = preempted_by(unit.demand.name, unit.index, unit.demand.tier, why)
    return _evict_for(run, unit, lambda v: may_preempt(unit, v), "preempt", cause)


def swap_for(run: Run, unit: Unit) -> bool:
    """Place an extra replica by putting a much less used one to sleep; False when none qualifies."""
    value = unit.demand.value
    if value <= 0:
        return False

    def ok(v: Unit) -> bool:
        return (v.phase == "extra" and v.demand is not unit.demand and v.demand.rank >= unit.demand.rank
                and v.demand.value * SWAP_FACTOR <= value)

    cause = (f"put to sleep for {unit.demand.name}#{unit.index} ({unit.demand.tier}, "
             f"{unit.demand.dep.traffic_rps:g} req/s): more tier-weighted traffic per replica")
    return _evict_for(run, unit, ok, "sleep", cause)


def _victims_on(run: Run, unit: Unit, g: int, ok: Callable[[Unit], bool]) -> tuple[Cost, list[Unit]] | None:
    """The cheapest victims on GPU g that make room for `unit`, with their cost; None if none do."""
    ledger = run.ledger
    pool = [v for v in ledger.holders[g] if ok(v)]
    if not pool:
        return None
    # Above their minimum first, then the lowest tier, then the least traffic, then the largest (fewer victims).
    pool.sort(key=lambda v: (v.demand.ready <= v.demand.low, -v.demand.rank, v.demand.value, -v.share))
    freed, taken = ledger.free(g), []
    for v in pool:
        if freed >= unit.share and run.placer.allows(unit, g, taken):
            break
        taken.append(v)
        freed += v.share
    if freed < unit.share or not taken or not run.placer.allows(unit, g, taken):
        return None
    cost = (sum(1 for v in taken if v.demand.ready <= v.demand.low), sum(TIER_WEIGHT[v.demand.tier] for v in taken),
            sum(v.demand.value for v in taken), len(taken), sum(v.share for v in taken))
    return cost, taken


def _evict_for(run: Run, unit: Unit, ok: Callable[[Unit], bool], kind: str, cause: str) -> bool:
    ledger = run.ledger
    # Victims are never of a higher tier, so a GPU whose own tier and lower tiers hold too little is skipped
    # without looking at its replicas.
    rank, share = unit.demand.rank, unit.share
    eligible = [g for g in ledger.eligible(unit.demand.key) if ledger.freeable(g, rank) >= share]
    best: tuple[Cost, tuple[int, ...], list[Unit]] | None = None
    if unit.width == 1:
        for g in eligible:
            if not ledger.holders[g]:
                continue
            found = _victims_on(run, unit, g, ok)
            if found and (best is None or found[0] < best[0]):
                best = (found[0], (g,), found[1])
    else:
        allowed = set(eligible)
        hosts: dict[str, int] = {}
        for g in eligible:
            hosts[ledger.host[g]] = hosts.get(ledger.host[g], 0) + 1
        for host, n in hosts.items():
            if n < unit.width:
                continue
            gpus = ledger.host_gpus[host]
            options = []
            for g in gpus:
                if g not in allowed:
                    continue
                if ledger.free(g) >= unit.share and run.placer.allows(unit, g):
                    options.append(((0, 0.0, 0.0, 0, 0), g, []))
                    continue
                found = _victims_on(run, unit, g, ok)
                if found:
                    options.append((found[0], g, found[1]))
            if len(options) < unit.width:
                continue
            options.sort(key=lambda o: (o[0], o[1]))
            chosen = options[: unit.width]
            cost = tuple(sum(o[0][k] for o in chosen) for k in range(5))
            if any(o[2] for o in chosen) and (best is None or cost < best[0]):
                victims = list({id(v): v for o in chosen for v in o[2]}.values())
                best = (cost, tuple(sorted(o[1] for o in chosen)), victims)  # type: ignore[assignment]
    if best is None:
        return False
    _, gpus, victims = best
    for v in victims:
        run.evict(v, kind, cause, unit)
    names = ", ".join(v.label for v in victims)
    run.place(unit, gpus, f"took the room of {names} (lower priority)" if kind == "preempt"
              else f"temporal swap: {names} sleeps instead (less tier-weighted traffic)")
    return True
