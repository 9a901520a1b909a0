"""The four placement strategies: which GPU (or GPUs, for a gang) a replica goes to, and a note saying why.

* fill-first: the fullest GPU already in use that fits; only when none fits, the largest idle GPU, on a
  host already in use if one fits. Fewest GPUs in use.
* balance: the GPU with the most free memory (worst fit), ties to every host's first GPU before any host's
  second. Spreads load.
* memory-optimized: best fit (the GPU it fits most tightly), largest replicas first; the planner adds an
  improvement search that repacks to place more.
* latency-sensitive: a latency-critical replica gets an idle GPU (best fit among idle ones) or else shares
  only with complementary, non-latency-critical workloads; other replicas pack onto GPUs in use first,
  keeping idle GPUs for latency-critical ones.
Each of them then spreads a deployment's replicas over GPUs, hosts and zones (spread.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from console.scheduler.constraints import Constraint, for_pass
from console.scheduler.gangs import choose_gang
from console.scheduler.index import IndexBook
from console.scheduler.ledger import Ledger
from console.scheduler.spread import pick
from console.scheduler.units import Unit


class Placer:
    """Base: best fit. Subclasses change the GPU preference (`candidates`, `rank`). Every strategy keeps to the
    pass's constraints (constraints.py) and spreads a deployment's replicas (spread.py) among the GPUs it would
    accept."""

    name = "memory-optimized"
    note = "best fit"

    def __init__(self, ledger: Ledger, book: IndexBook, constraints: Sequence[Constraint] | None = None) -> None:
        self.ledger = ledger
        self.book = book
        self.constraints = tuple(for_pass(self.name) if constraints is None else constraints)
        # What a strategy's candidates are checked against before spread.pick chooses among them.
        self.screens = tuple(c for c in self.constraints if not c.picked)

    def allows(self, unit: Unit, g: int, leaving: Iterable[Unit] = ()) -> bool:
        """Whether every constraint lets `unit` on GPU g (with those `leaving` gone from it)."""
        return self.admits(unit, (g,), leaving)

    def admits(self, unit: Unit, gpus: Sequence[int], leaving: Iterable[Unit] = ()) -> bool:
        """Whether every constraint lets `unit` on all of `gpus` (with those `leaving` gone from them)."""
        ledger = self.ledger
        for c in self.constraints:
            if c.check(ledger, unit, gpus, leaving):
                return False
        return True

    def screened(self, unit: Unit) -> tuple[Constraint, ...]:
        """The constraints that `unit`'s candidates are checked against (none: every fitting GPU is a candidate)."""
        return tuple(c for c in self.screens if c.applies(unit))

    def rank(self, unit: Unit, g: int) -> tuple:
        """Preference among a few candidate GPUs (a host's GPUs, a gang's members): lower is better."""
        return (self.ledger.free(g), g)

    def choose(self, unit: Unit, only_host: str | None = None, exclude: int | None = None
               ) -> tuple[tuple[int, ...], str] | None:
        """GPUs for `unit` (on `only_host` if given, never GPU `exclude`) and a note on why, or None."""
        if unit.width > 1:
            return choose_gang(self, unit, only_host, exclude)
        if only_host is not None:
            eligible = self.ledger.eligible_set(unit.demand.key)
            fits = sorted((g for g in self.ledger.host_gpus.get(only_host, ()) if g in eligible
                           and self.ledger.free(g) >= unit.share and self.allows(unit, g)),
                          key=lambda g: self.rank(unit, g))
            found = pick(self.ledger, unit, ((g, f"{self.note} on its own host") for g in fits), exclude)
        else:
            found = pick(self.ledger, unit, self.fitting(unit), exclude)
        return None if found is None else ((found[0],), found[1])

    def fitting(self, unit: Unit) -> Iterator[tuple[int, str]]:
        """`candidates` that the constraints let `unit` on (spread.pick applies the others)."""
        screens = self.screened(unit) if self.screens else ()
        if not screens:
            return self.candidates(unit)
        ledger = self.ledger
        return ((g, note) for g, note in self.candidates(unit)
                if not any(c.check(ledger, unit, (g,)) for c in screens))

    def candidates(self, unit: Unit) -> Iterator[tuple[int, str]]:
        """The GPUs `unit` fits on, the strategy's choice first, each with a note on why."""
        index = self.book.gpus(("free", unit.demand.key), self.ledger.eligible(unit.demand.key), self.ledger.free)
        entries = index.entries
        for i in range(index.position(unit.share), len(entries)):
            yield entries[i][1], self.note


class FillFirst(Placer):
    name = "fill-first"
    note = "fill first"

    def _key(self, g: int) -> tuple:
        if self.ledger.holders[g]:
            return (0, self.ledger.free(g))
        host_busy = self.ledger.host_ready[self.ledger.host[g]] > 0
        return (1, 0 if host_busy else 1, -self.ledger.free(g))

    def rank(self, unit: Unit, g: int) -> tuple:
        return self._key(g) + (g,)

    def candidates(self, unit: Unit) -> Iterator[tuple[int, str]]:
        index = self.book.gpus(("fill", unit.demand.key), self.ledger.eligible(unit.demand.key), self._key,
                               host_scoped=True)
        entries = index.entries
        in_use = range(index.position((0, unit.share)), index.position((1,)))
        for i in in_use:
            yield entries[i][1], "fill first: the fullest GPU in use that fits"
        why = "" if in_use else "no GPU in use has room; "  # else spread passed those by
        for busy, words in ((0, "on a host in use"), (1, "on an idle host")):
            for i in range(index.position((1, busy)), index.position((1, busy + 1))):
                g = entries[i][1]
                if self.ledger.free(g) < unit.share:
                    break
                yield g, f"fill first: {why}opened the largest idle GPU {words}"


class Balance(Placer):
    name = "balance"
    note = "balance: the GPU with the most free memory"

    def _key(self, g: int) -> tuple:
        # Among equally free GPUs, every host's first GPU comes before any host's second: spread over hosts.
        return (-self.ledger.free(g), self.ledger.slot[g])

    def rank(self, unit: Unit, g: int) -> tuple:
        return self._key(g) + (g,)

    def candidates(self, unit: Unit) -> Iterator[tuple[int, str]]:
        index = self.book.gpus(("balance", unit.demand.key), self.ledger.eligible(unit.demand.key), self._key)
        for _, g in index.entries:
            if self.ledger.free(g) < unit.share:
                return
            yield g, self.note


class LatencySensitive(Placer):
    name = "latency-sensitive"
    note = "latency-sensitive"

    def fitting(self, unit: Unit) -> Iterator[tuple[int, str]]:
        return self.candidates(unit)  # they check every constraint themselves

    def _key(self, g: int) -> tuple:
        return (1 if self.ledger.holders[g] else 0, self.ledger.free(g))

    def rank(self, unit: Unit, g: int) -> tuple:
        idle = not self.ledger.holders[g]
        return (0 if idle == unit.demand.lc else 1, self.ledger.free(g), g)

    def candidates(self, unit: Unit) -> Iterator[tuple[int, str]]:
        index = self.book.gpus(("latency", unit.demand.key), self.ledger.eligible(unit.demand.key), self._key)
        entries = index.entries
        idle = (index.position((0, unit.share)), index.position((1,)))
        shared = (index.position((1, unit.share)), len(entries))
        order = (idle, shared) if unit.demand.lc else (shared, idle)
        for lo, hi in order:
            for i in range(lo, hi):
                g = entries[i][1]
                if self.allows(unit, g):
                    if not self.ledger.holders[g]:
                        what = "a GPU of its own" if unit.demand.lc else "an idle GPU (no shared GPU fits)"
                    elif unit.demand.lc:
                        what = "a GPU shared only with complementary workloads"
                    else:
                        what = "a shared GPU (idle GPUs stay free for latency-critical replicas)"
                    yield g, f"latency-sensitive: {what}, best fit"


PLACERS = {p.name: p for p in (FillFirst, Balance, Placer, LatencySensitive)}


def make_placer(strategy: str, ledger: Ledger, book: IndexBook, constraints: Sequence[Constraint] | None = None
                ) -> Placer:
    """The placer for a strategy name, keeping to `constraints` (default: the built-in ones, constraints.for_pass)."""
    try:
        return PLACERS[strategy](ledger, book, constraints)
    except KeyError:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(PLACERS)}") from None
