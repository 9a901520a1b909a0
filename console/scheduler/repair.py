"""Placing what best fit alone could not: memory-optimized's repack of one class, and single-move repairs.

A move of an existing replica (a reload elsewhere) is made only when it places a replica that fits
nowhere otherwise, only for a replica of the same or a lower tier than the one it makes room for, and
at most `Settings.max_moves` times per plan.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from console.scheduler.improve import Repack
from console.scheduler.units import Unit

if TYPE_CHECKING:
    from console.scheduler.run import Run

MOVE_SCAN = 64  # the roomiest GPUs a one-move repair looks at


def one_move(run: Run, unit: Unit) -> bool:
    """Move one replica off a GPU so `unit` fits there; False when no single move does it."""
    if unit.width != 1:
        return False
    ledger, placer = run.ledger, run.placer
    index = run.book.gpus(("free", unit.demand.key), ledger.eligible(unit.demand.key), ledger.free)
    entries = index.entries
    best = None
    for i in range(len(entries) - 1, max(len(entries) - 1 - MOVE_SCAN, -1), -1):
        g = entries[i][1]
        deficit = unit.share - ledger.free(g)
        if deficit <= 0:
            continue
        for mover in ledger.holders[g]:
            if mover.width != 1 or mover.share < deficit or mover.demand.rank < unit.demand.rank:
                continue
            if mover.fixed and run.moves_left <= 0:
                continue
            cost = (mover.fixed, mover.share)
            if best is not None and cost >= best[0]:
                continue
            if not placer.allows(unit, g, (mover,)):
                continue
            target = placer.choose(mover, exclude=g)
            if target is not None:
                best = (cost, mover, g, target)
    if best is None:
        return False
    _, mover, g, (gpus, note) = best
    run.relocate(mover, gpus, note, unit)
    run.place(unit, (g,), f"{placer.note}, after moving {mover.named_for(unit)} away")
    return True


def repack_class(run: Run, units: list[Unit], failed: list[Unit]) -> list[Unit]:
    """Memory-optimized: repack this class's new single-GPU replicas to place more; returns those still failed."""
    ledger = run.ledger
    waiting = {id(u) for u in failed}
    items = [u for u in units if u.width == 1 and not u.fixed and u.share > 0
             and (u.state == "ready" or id(u) in waiting)]
    if run.placer.screens:  # the search packs by size alone: what a constraint may keep off a GPU stays out of it
        items = [u for u in items if not run.placer.screened(u)]
    if not any(id(u) in waiting for u in items):
        return failed
    keys = {u.demand.key for u in items}
    gpus = sorted({g for key in keys for g in ledger.eligible(key)})
    local = {g: b for b, g in enumerate(gpus)}
    mine = {id(u) for u in items}
    capacities = [ledger.free(g) + sum(u.share for u in ledger.holders[g] if id(u) in mine) for g in gpus]
    eligible = [{local[g] for g in ledger.eligible(u.demand.key)} if ledger.restricts(u.demand.key) else None
                for u in items]
    assign = [local[u.gpus[0]] if u.state == "ready" else None for u in items]
    started = perf_counter()
    search = Repack(capacities, [u.share for u in items], eligible, assign, run.settings.seed)
    best, iterations, stopped = search.run(run.deadline, run.settings.search_iterations)
    before = sum(b is not None for b in assign)
    after = sum(b is not None for b in best)
    moved = [(u, b) for u, a, b in zip(items, assign, best, strict=True) if a != b]
    for u, _ in moved:
        if u.state == "ready":
            run.take_off(u)
    for u, b in moved:
        if b is not None:
            g = gpus[b]
            run.place(u, (g,), f"best fit + repack (the improvement search placed {after - before} more of "
                               f"this class in {1000 * (perf_counter() - started):.0f} ms)")
    run.record_search(iterations, after - before, stopped)
    still = [u for u in items if u.state != "ready"]
    return still + [u for u in failed if id(u) not in mine]

