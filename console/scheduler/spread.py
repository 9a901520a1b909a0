"""Topology spread: a deployment's replicas go to different GPUs, then different hosts, then different zones (a
GPU's `zone` label, from its host's), so that one failure takes as few of them as it can.

`preferred` (the default) takes the most spread place the strategy would accept, and when the replica has to
share a GPU, host or zone with another of its deployment the reason says so; `required` never puts two replicas of
one deployment on one GPU (they stay unplaced instead); `none` leaves it to the strategy. Gangs (replicas of
several GPUs) are not spread. Spread is decided as a replica is placed: replicas that already run stay put.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from console.scheduler.ledger import Ledger
    from console.scheduler.units import Unit

ZONE = "zone"
LOOKAHEAD = 64  # candidates looked through for another host or zone once another GPU is found


def crowds(unit: Unit, g: int, leaving: Iterable[Unit] = ()) -> bool:
    """Whether GPU g holds another replica of `unit`'s deployment (except those `leaving`) under required spread."""
    if unit.demand.dep.spread != "required":
        return False
    gone = set(map(id, leaving))
    return any(v is not unit and g in v.gpus and id(v) not in gone for v in unit.demand.members)


def crowded(unit: Unit, g: int | None = None) -> bool:
    """Whether another replica of `unit`'s deployment is on GPU g (default: the GPU `unit` is on)."""
    if g is None:
        g = unit.gpus[0]
    return any(v is not unit and g in v.gpus for v in unit.demand.members)


def pick(ledger: Ledger, unit: Unit, candidates: Iterator[tuple[int, str]], exclude: int | None
         ) -> tuple[int, str] | None:
    """The first of the strategy's `candidates` (fitting GPUs, best first, each with a note) that is most apart from
    the other ready replicas of `unit`'s deployment, with the note saying how apart it is; None when none will do."""
    dep = unit.demand.dep
    others = [u for u in unit.demand.members if u is not unit and u.gpus] if dep.spread != "none" else ()
    if not others:
        for g, note in candidates:
            if g != exclude:
                return g, note
        return None
    gpus = {g for u in others for g in u.gpus}
    hosts = {ledger.host[g] for g in gpus}
    zones = {ledger.zone[g] for g in gpus} - {None}
    best: tuple[int, int, str] | None = None
    looked, cut = 0, False
    for g, note in candidates:
        if g == exclude:
            continue
        if g in gpus:
            level = 3
        elif ledger.host[g] in hosts:
            level = 2
        elif ledger.zone[g] in zones:
            level = 1
        else:
            return g, f"{note}, apart from the other replicas of {dep.name}"
        if best is None or level < best[0]:
            best = (level, g, note)
        if best[0] < 3:
            looked += 1
            if looked >= LOOKAHEAD:
                cut = True
                break
    if best is None or (best[0] == 3 and dep.spread == "required"):
        return None
    level, g, note = best
    where = (f"in zone {ledger.zone[g]} beside another replica: no zone without one has room",
             f"on host {ledger.host[g]} beside another replica: no host without one has room",
             f"sharing {ledger.ids[g]} with another replica: no GPU without one has room")[level - 1]
    if cut:
        where += f" among the {LOOKAHEAD} best places"
    return g, f"{note}, {where}"
