"""Spatial sharing: the CUDA MPS active-thread percentage of each replica on a shared GPU.

Rule: each replica gets a weight from its tier (critical 100, high 70, standard 50, batch 25), plus 30
(at most 100) when it is latency-critical. On a GPU that several ready replicas share, a replica's
percentage is its weight over the sum of the weights there, times 100, at least 10, rounded; a gang
takes the smallest of its GPUs' percentages. The shares of one GPU add up to about 100, so no replica
can crowd out the others, and the more important one gets more of the SMs. A replica alone on its GPUs
gets None: it needs no MPS limit.
"""

from __future__ import annotations

from console.scheduler.ledger import Ledger
from console.scheduler.units import Unit

TIER_MPS = {"critical": 100, "high": 70, "standard": 50, "batch": 25}
LATENCY_BONUS = 30
MIN_MPS = 10


def mps_weight(unit: Unit) -> int:
    """A replica's claim on a shared GPU's SMs."""
    weight = TIER_MPS[unit.demand.tier]
    weight = min(100, weight + LATENCY_BONUS) if unit.demand.lc else weight
    unit.demand.mps_weight = weight
    return weight


def mps_percentages(ledger: Ledger) -> dict[int, tuple[int, int, int, int]]:
    """id(unit) -> (percentage, weight, total weight, GPU number) for every ready replica that shares a GPU."""
    found: dict[int, tuple[int, int, int, int]] = {}
    for g, holders in enumerate(ledger.holders):
        if len(holders) < 2:
            continue
        weights = [u.demand.mps_weight or mps_weight(u) for u in holders]
        total = sum(weights)
        for unit, weight in zip(holders, weights, strict=True):
            pct = max(MIN_MPS, round(100 * weight / total))
            key = id(unit)
            if key not in found or pct < found[key][0]:
                found[key] = (pct, weight, total, g)
    return found


def mps_reason(unit: Unit, ledger: Ledger, share: tuple[int, int, int, int], cache: dict) -> str:
    """Why a replica got its MPS percentage (`cache` holds the per-GPU part, shared by its replicas)."""
    pct, weight, total, g = share
    where = cache.get(g)
    if where is None:
        where = cache[g] = f" of {total} on {ledger.ids[g]}, shared by {len(ledger.holders[g])} replicas"
    lc = ", latency-critical" if unit.demand.lc else ""
    return f"MPS {pct}% of SMs: weight {weight} ({unit.demand.tier}{lc}){where}"
