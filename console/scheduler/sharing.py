"""Spatial sharing: the CUDA MPS active-thread percentage of each replica on a shared GPU.

Rule: each replica gets a weight from its tier (critical 100, high 70, standard 50, batch 25), plus 30
(at most 100) when it is latency-critical. On a GPU that several ready replicas share, a replica's
percentage is its weight over the sum of the weights there, times 100, at least 10, rounded; a gang
takes the smallest of its GPUs' percentages. The shares of one GPU add up to about 100, so no replica
can crowd out the others, and the more important one gets more of the SMs. A replica alone on its GPUs
gets None: it needs no MPS limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from console.scheduler.ledger import Ledger

if TYPE_CHECKING:
    from console.scheduler.units import Unit

TIER_MPS = {"critical": 100, "high": 70, "standard": 50, "batch": 25}
LATENCY_BONUS = 30
MIN_MPS = 10


def mps_weight(tier: str, latency_critical: bool) -> int:
    """A replica's claim on a shared GPU's SMs."""
    weight = TIER_MPS[tier]
    return min(100, weight + LATENCY_BONUS) if latency_critical else weight


def weight_totals(ledger: Ledger) -> list[int]:
    """The sum of the weights of the replicas on each GPU that several of them share; 0 on the others."""
    totals = [0] * len(ledger)
    for g, holders in enumerate(ledger.holders):
        if len(holders) > 1:
            total = 0
            for unit in holders:
                total += unit.demand.mps_weight
            totals[g] = total
    return totals


def percentage(weight: int, total: int) -> int:
    """A replica's share of a GPU whose replicas weigh `total` together."""
    return max(MIN_MPS, round(100 * weight / total))


def mps_of(totals: list[int], unit: Unit) -> tuple[int, int] | None:
    """(percentage, the GPU number that sets it) of a ready replica: the smallest share over its GPUs (the first
    such GPU); None when it is alone on its GPUs."""
    best = None
    weight = unit.demand.mps_weight
    for g in unit.gpus:
        total = totals[g]
        if total:
            found = (percentage(weight, total), g)
            if best is None or found < best:
                best = found
    return best


def mps_text(ledger: Ledger, totals: list[int], unit: Unit, pct: int, g: int) -> str:
    """Why `unit` gets `pct` (set by GPU g): "MPS 80% of SMs: weight 100 (critical, latency-critical) of 125 on
    h/0, shared by 2 replicas"."""
    d = unit.demand
    lc = ", latency-critical" if d.lc else ""
    return (f"MPS {pct}% of SMs: weight {d.mps_weight} ({d.tier}{lc}) of {totals[g]} on {ledger.ids[g]}, "
            f"shared by {len(ledger.holders[g])} replicas")
