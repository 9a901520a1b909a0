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

TIER_MPS = {"critical": 100, "high": 70, "standard": 50, "batch": 25}
LATENCY_BONUS = 30
MIN_MPS = 10


def mps_weight(tier: str, latency_critical: bool) -> int:
    """A replica's claim on a shared GPU's SMs."""
    weight = TIER_MPS[tier]
    return min(100, weight + LATENCY_BONUS) if latency_critical else weight


def assign_mps(ledger: Ledger) -> None:
    """Set `unit.mps` = (percentage, why) on every ready replica that shares a GPU."""
    for g, holders in enumerate(ledger.holders):
        if len(holders) < 2:
            continue
        weights = [u.demand.mps_weight for u in holders]
        total = sum(weights)
        texts: dict[tuple, tuple[int, str]] = {}  # (tier, latency-critical) -> (percentage, why), shared
        for unit, weight in zip(holders, weights, strict=True):
            kind = (unit.demand.tier, unit.demand.lc)
            found = texts.get(kind)
            if found is None:
                pct = max(MIN_MPS, round(100 * weight / total))
                lc = ", latency-critical" if unit.demand.lc else ""
                found = (pct, f"MPS {pct}% of SMs: weight {weight} ({unit.demand.tier}{lc}) of {total} on "
                              f"{ledger.ids[g]}, shared by {len(holders)} replicas")
                texts[kind] = found
            if unit.mps is None or found[0] < unit.mps[0]:
                unit.mps = found
