"""Gangs: a replica that needs several GPUs gets them all on one host, or none.

Hosts are indexed by the free space of their `width`-th roomiest eligible GPU (the largest share a gang
of that width can get there), so finding hosts that can take a gang is a binary search.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import compress, repeat
from operator import ge
from typing import TYPE_CHECKING

from console.scheduler.index import SortedIndex, kth_free

if TYPE_CHECKING:
    from console.scheduler.strategies import Placer
    from console.scheduler.units import Unit


def host_index(placer: Placer, unit: Unit) -> SortedIndex:
    """Hosts by the largest per-GPU share a gang of this width and selector can get there."""
    ledger, key, width = placer.ledger, unit.demand.key, unit.width
    eligible = ledger.eligible_set(key) if key else None
    return placer.book.hosts(("kth", key, width), ledger.host_gpus, lambda h: kth_free(ledger, h, eligible, width))


def candidate_hosts(placer: Placer, unit: Unit) -> Iterator[str]:
    """Hosts that may take the gang, in the strategy's order of preference."""
    index = host_index(placer, unit)
    entries, start = index.entries, index.position(unit.share)
    if placer.name == "balance":
        for i in range(len(entries) - 1, start - 1, -1):
            yield entries[i][1]
    elif placer.name == "fill-first":
        busy = placer.ledger.host_ready
        yield from (h for _, h in entries[start:] if busy[h] > 0)
        yield from (h for _, h in entries[start:] if busy[h] == 0)
    else:
        for i in range(start, len(entries)):
            yield entries[i][1]


def choose_gang(placer: Placer, unit: Unit, only_host: str | None, exclude: int | None
                ) -> tuple[tuple[int, ...], str] | None:
    """`unit.width` GPUs on one host, each with `unit.share` free, picked by the strategy, or None."""
    ledger = placer.ledger
    eligible = ledger.eligible_set(unit.demand.key)
    if only_host is not None:
        hosts: Iterator[str] = iter([only_host] if only_host in ledger.host_gpus else [])
    else:
        hosts = candidate_hosts(placer, unit)
    for host in hosts:
        fits = [g for g in ledger.host_gpus[host] if g in eligible and g != exclude
                and ledger.free(g) >= unit.share and placer.allows(unit, g)]
        if len(fits) >= unit.width:
            pick = tuple(sorted(sorted(fits, key=lambda g: placer.rank(unit, g))[: unit.width]))
            if placer.admits(unit, pick):  # a constraint may judge the GPUs together (a cap on a team's GPUs)
                return pick, placer.note
    return None


def gang_shortfall(placer: Placer, unit: Unit) -> str:
    """Why no host can take the gang: how many fitting GPUs the best host has."""
    ledger = placer.ledger
    eligible = ledger.eligible_set(unit.demand.key) if ledger.restricts(unit.demand.key) else None
    gpus_of = ledger.host_gpus
    if eligible is None:
        most_gpus = max(map(len, gpus_of.values()), default=0)
    else:
        most_gpus = max((sum(1 for g in gs if g in eligible) for gs in gpus_of.values()), default=0)
    if most_gpus < unit.width:
        return f"no host has {unit.width} eligible GPUs (the most is {most_gpus})"
    frees, share = ledger.frees(), unit.share
    best, where = 0, ""
    fits = set(compress(range(len(frees)), map(ge, frees, repeat(share))))  # the GPUs with that much free
    if eligible is not None:
        fits &= eligible
    for host, gs in gpus_of.items():
        n = len(fits.intersection(gs)) if fits else 0
        if n > best:
            best, where = n, host
    if not best:
        return "no GPU has that much free"
    return f"at most {best} such GPU{'s' if best != 1 else ''} on one host ({where})"
