"""Placement constraints: small filters that say whether a replica may go on some GPUs, and if not, why.

A constraint answers one question, `check(ledger, unit, gpus, leaving)`: may `unit` go on GPU numbers `gpus` of
the ledger, with the replicas `leaving` gone from them? It returns "" when it may, else the reason. Wherever a
replica is placed, woken, moved or makes room by evicting others, the placer asks every constraint of the pass
(strategies.Placer.allows, .admits); a refusal counts the GPUs with room that each constraint kept a replica off,
the first to object taking the blame, and says so in that constraint's words (`excluded`, outcome.py).

The constraints of a pass are `for_pass(strategy, extra)`: the built-in ones below, then a PlanInput's own
(`PlanInput.constraints`), in the order refusals name them. A new rule (a per-team GPU cap, say) is one class with
these four members, passed in; nothing else changes.

Where a replica may go at all by its labels and taints (an engine is a label) is not a constraint: it depends on the
deployment and the GPU alone, so the ledger works it out once per selector (ledger.eligible). Room is the ledger's
too: candidates come from indexes of free space, never from a scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from console.scheduler.explain import excluded_by_neighbours, excluded_by_spread
from console.scheduler.spread import crowds

if TYPE_CHECKING:
    from console.scheduler.ledger import Ledger
    from console.scheduler.units import Unit

# Profile pairs that may share a GPU when one of them is latency-critical: they contend for different units.
COMPLEMENTARY = {frozenset(p) for p in (("compute", "memory"), ("compute", "io"), ("memory", "io"), ("io",))}


class Constraint(Protocol):
    """A rule on where a replica may go."""

    # Spread's own preference (spread.pick) already keeps its replicas off the GPUs this rule forbids, so a
    # strategy's candidates need not be checked against it first.
    picked: bool

    def applies(self, unit: Unit) -> bool:
        """Whether it can forbid anything to `unit` (a cheap test that spares the checks when it cannot)."""

    def check(self, ledger: Ledger, unit: Unit, gpus: Sequence[int], leaving: Iterable[Unit] = ()) -> str:
        """"" when `unit` may go on `gpus` with `leaving` gone from them, else why not."""

    def excluded(self, count: int) -> str:
        """A refusal's clause for `count` GPUs with room that it alone kept a replica off ("; 2 GPUs ...")."""


class RequiredSpread:
    """Under required spread, never two replicas of one deployment on one GPU."""

    picked = True

    def applies(self, unit: Unit) -> bool:
        return unit.demand.dep.spread == "required"

    def check(self, ledger: Ledger, unit: Unit, gpus: Sequence[int], leaving: Iterable[Unit] = ()) -> str:
        if unit.demand.dep.spread != "required":
            return ""
        for g in gpus:
            if crowds(unit, g, leaving):
                return f"{ledger.ids[g]} holds a replica of it already (spread required)"
        return ""

    def excluded(self, count: int) -> str:
        return excluded_by_spread(count)


def compatible(a: Unit, b: Unit) -> bool:
    """Whether two replicas may share a GPU under latency-sensitive placement."""
    if not (a.demand.lc or b.demand.lc):
        return True
    if a.demand.lc and b.demand.lc:
        return False
    p, q = a.demand.profile, b.demand.profile
    return p is not None and q is not None and frozenset((p, q)) in COMPLEMENTARY


class Neighbours:
    """Latency-sensitive: a latency-critical replica shares a GPU only with complementary, non-latency-critical
    workloads."""

    picked = False

    def applies(self, unit: Unit) -> bool:
        return True  # a replica that is not latency-critical still keeps off a latency-critical one's GPU

    def check(self, ledger: Ledger, unit: Unit, gpus: Sequence[int], leaving: Iterable[Unit] = ()) -> str:
        gone = set(map(id, leaving)) if leaving else None
        for g in gpus:
            for other in ledger.holders[g]:
                if (gone is None or id(other) not in gone) and not compatible(unit, other):
                    return f"{ledger.ids[g]} holds latency-critical or non-complementary replicas"
        return ""

    def excluded(self, count: int) -> str:
        return excluded_by_neighbours(count)


REQUIRED_SPREAD, NEIGHBOURS = RequiredSpread(), Neighbours()


def for_pass(strategy: str, extra: Iterable[Constraint] = ()) -> tuple[Constraint, ...]:
    """The constraints of a pass under `strategy`: the built-in ones, then `extra`."""
    built_in = (REQUIRED_SPREAD, NEIGHBOURS) if strategy == "latency-sensitive" else (REQUIRED_SPREAD,)
    return built_in + tuple(extra)
