"""Taking room from less important replicas: priority preemption and temporal swaps.

Preemption (for replicas up to a minimum, or added for an SLO): victims are strictly lower tiers (and,
for a minimum, the same tier's extra replicas), never an equal or higher tier. Victims above their own
minimum go first, then the lowest tier, then the least traffic; the GPU (or host, for a gang) where the
cheapest set of victims makes room wins.

Temporal swap (for extra replicas when demand exceeds capacity): an extra replica whose tier-weighted
traffic per replica is at least twice another's, of the same or a lower tier, sends that one to sleep.
The factor of two keeps two similar replicas from trading places on every pass. A replica kept from before
this pass that was placed or woken less than `Settings.min_residency_s` ago is not swapped out.

Demand eviction (demand.py) uses the same search with its own victims, order and cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from console.scheduler.explain import preempted_by
from console.scheduler.units import TIER_WEIGHT, Unit, within_residency

if TYPE_CHECKING:
    from console.scheduler.run import Run

SWAP_FACTOR = 2.0
Cost = tuple[int, float, float, int, int]
Describe = Callable[[Unit], tuple[str, str]]  # victim -> (kind, cause)
Found = tuple[Cost, tuple[int, ...], list[Unit]]  # cost, GPUs, victims


def may_preempt(unit: Unit, victim: Unit) -> bool:
    """Whether `unit` outranks `victim` enough to take its room.

    A replica lifted for waiting requests (phase "demand") counts as what it is in the next pass, once it is
    ready: an extra (or SLO) replica of its deployment. Were it spared here, the next pass would preempt it.
    """
    if victim.demand.rank > unit.demand.rank:
        return True
    phase = victim.demand.rest_phase if victim.phase == "demand" else victim.phase
    return (unit.phase == "min" and victim.demand.rank == unit.demand.rank and phase == "extra"
            and victim.demand is not unit.demand)


def preempt_for(run: Run, unit: Unit, phase: str | None = None) -> bool:
    """Place `unit` by preempting lower-priority replicas; False when no set of them makes room. `phase`: the
    phase it is preempting as (default its own)."""
    why = unit.demand.why(unit.phase if phase is None else phase)
    return evict_for(run, unit, lambda v: may_preempt(unit, v), "preempt", "",
                      describe=lambda v: ("preempt", preempted_by(unit.named_for(v), unit.demand.tier, why)))


def swap_for(run: Run, unit: Unit) -> bool:
    """Place an extra replica by putting a much less used one to sleep; False when none qualifies."""
    value = unit.demand.value
    if value <= 0:
        return False

    now, residency = run.request.now, run.settings.min_residency_s

    def ok(v: Unit) -> bool:
        # Never a replica of a deployment with requests waiting: those requests are what it is there for
        # (and in the pass that lifted it for them it was no extra, so swapping it now would flap).
        return (v.phase == "extra" and v.demand is not unit.demand and v.demand.rank >= unit.demand.rank
                and v.demand.dep.demand == 0
                and v.demand.value * SWAP_FACTOR <= value and within_residency(v, now, residency) is None)

    def cause(v: Unit) -> tuple[str, str]:
        return "sleep", (f"put to sleep for {unit.named_for(v)} ({unit.demand.tier}, "
                         f"{unit.demand.dep.traffic_rps:g} req/s): more tier-weighted traffic per replica")

    return evict_for(run, unit, ok, "sleep", "", describe=cause)


def victim_order(v: Unit) -> tuple:
    """Preemption and swaps: above their minimum first, then the lowest tier, then the least traffic, then the
    largest (fewer victims)."""
    return (v.demand.ready <= v.demand.low, -v.demand.rank, v.demand.value, -v.share)


def victims_cost(taken: list[Unit]) -> Cost:
    """Preemption and swaps: replicas at their minimum, tier weight, traffic, count, bytes (lower is cheaper)."""
    return (sum(1 for v in taken if v.demand.ready <= v.demand.low), sum(TIER_WEIGHT[v.demand.tier] for v in taken),
            sum(v.demand.value for v in taken), len(taken), sum(v.share for v in taken))


def victims_on(run: Run, unit: Unit, g: int, ok: Callable[[Unit], bool], order: Callable[[Unit], tuple],
                cost: Callable[[list[Unit]], Cost]) -> tuple[Cost, list[Unit]] | None:
    """The cheapest victims on GPU g that make room for `unit`, with their cost; None if none do."""
    ledger = run.ledger
    pool = [v for v in ledger.holders[g] if ok(v)]
    if not pool:
        return None
    if len(pool) > 1:
        pool.sort(key=order)
    freed, taken = ledger.free(g), []
    for v in pool:
        if freed >= unit.share and run.placer.allows(unit, g, taken):
            break
        taken.append(v)
        freed += v.share
    if freed < unit.share or not taken or not run.placer.allows(unit, g, taken):
        return None
    return cost(taken), taken


def evict_for(run: Run, unit: Unit, ok: Callable[[Unit], bool], kind: str, cause: str, *,
               order: Callable[[Unit], tuple] = victim_order, cost: Callable[[list[Unit]], Cost] = victims_cost,
               describe: Describe | None = None, note: Callable[[list[Unit]], str] | None = None,
               single: Callable[[], Found | None] | None = None) -> bool:
    """Place `unit` where evicting the cheapest victims (`ok`, taken in `order`, compared by `cost`) makes room.

    Each victim gets `kind` and `cause`, or what `describe(victim)` says; the placement's note is `note(victims)`.
    `single` replaces the scan of every GPU for a one-GPU replica (it must find what the scan would).
    """
    ledger = run.ledger
    best: Found | None = None
    if unit.width == 1 and single is not None:
        best = single()
    elif unit.width == 1:
        # Victims are never of a higher tier, so a GPU whose own tier and lower tiers hold too little is skipped
        # without looking at its replicas.
        rank, share = unit.demand.rank, unit.share
        freeable, holders = ledger.freeables(rank), ledger.holders
        for g in ledger.eligible(unit.demand.key):
            if not holders[g] or freeable[g] < share:
                continue
            found = victims_on(run, unit, g, ok, order, cost)
            if found and (best is None or found[0] < best[0]):
                best = (found[0], (g,), found[1])
    else:
        rank, share = unit.demand.rank, unit.share
        freeable = ledger.freeables(rank)
        if ledger.restricts(unit.demand.key):
            eligible = [g for g in ledger.eligible(unit.demand.key) if freeable[g] >= share]
        else:
            eligible = [g for g, room in enumerate(freeable) if room >= share]
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
                found = victims_on(run, unit, g, ok, order, cost)
                if found:
                    options.append((found[0], g, found[1]))
            if len(options) < unit.width:
                continue
            options.sort(key=lambda o: (o[0], o[1]))
            chosen = options[: unit.width]
            total = tuple(sum(o[0][k] for o in chosen) for k in range(5))
            if any(o[2] for o in chosen) and (best is None or total < best[0]):
                victims = list({id(v): v for o in chosen for v in o[2]}.values())
                best = (total, tuple(sorted(o[1] for o in chosen)), victims)  # type: ignore[assignment]
    if best is None:
        return False
    _, gpus, victims = best
    for v in victims:
        if describe is not None:
            kind, cause = describe(v)
        run.evict(v, kind, cause, unit)
    names = ", ".join(v.named_for(unit) for v in victims)
    if note is not None:
        words = note(victims)
    elif kind == "preempt":
        words = f"took the room of {names} (lower priority)"
    else:
        words = f"temporal swap: {names} sleeps instead (less tier-weighted traffic)"
    run.place(unit, gpus, words)
    return True
