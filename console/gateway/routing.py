"""Choosing a replica for one request: least outstanding requests, or, for an adapter, consistent hashing
with bounded loads (Mirrokni, Thorup and Zadimoghaddam), so one adapter's requests go to few replicas (its
weights stay resident there) while a hot adapter spills over to the next replicas on the ring. With prefix
matches (prefix_index.py), the replica holding the longest run of the prompt's leading blocks comes first, under
the same bound, so a hot prefix spills over too.

Pure: replicas are plain ids, outstanding counts are passed in, nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

LOAD_FACTOR = 1.25  # no replica above 1.25x the mean load (the bound the issue and the paper use)
NEAR = 0.05  # predictions this close count as a tie: the replica holding more of the prompt, then the least loaded
POINTS_PER_REPLICA = 64  # virtual nodes: enough for an even ring over a handful of replicas


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=1024)
def _ring(replicas: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The hash ring of a replica set: sorted point positions and the replica at each (cached per set)."""
    points = sorted((_hash(f"{r}:{i}"), r) for r in replicas for i in range(POINTS_PER_REPLICA))
    return tuple(p for p, _ in points), tuple(r for _, r in points)


def least_outstanding(replicas: Sequence[int], outstanding: Mapping[int, int], turn: int = 0) -> int:
    """The replica with the fewest requests in flight; ties rotate with `turn`, so idle replicas share work."""
    n = len(replicas)
    best, best_load = replicas[turn % n], None
    for k in range(n):
        r = replicas[(turn + k) % n]
        load = outstanding.get(r, 0)
        if best_load is None or load < best_load:
            best, best_load = r, load
    return best


def bounded_load_bound(total_outstanding: int, n: int, factor: float = LOAD_FACTOR) -> int:
    """The most requests one of `n` replicas may hold once this request is added."""
    return max(1, math.ceil(factor * (total_outstanding + 1) / n))


def affinity_choice(key: str, replicas: Sequence[int], outstanding: Mapping[int, int],
                    factor: float = LOAD_FACTOR) -> int:
    """The first replica clockwise from `key` on the ring whose load stays within the bound."""
    ids = tuple(sorted(replicas))
    if len(ids) == 1:
        return ids[0]
    positions, owners = _ring(ids)
    bound = bounded_load_bound(sum(outstanding.get(r, 0) for r in ids), len(ids), factor)
    start = bisect.bisect(positions, _hash(key)) % len(positions)
    seen: set[int] = set()
    for k in range(len(positions)):
        r = owners[(start + k) % len(positions)]
        if r in seen:
            continue
        if outstanding.get(r, 0) + 1 <= bound:
            return r
        seen.add(r)
        if len(seen) == len(ids):
            break
    return least_outstanding(ids, outstanding)  # unreachable with factor >= 1; kept as a safe answer


def prefix_choice(matches: Mapping[int, int], blocks: int, replicas: Sequence[int], outstanding: Mapping[int, int],
                  turn: int = 0, adapter: str | None = None, factor: float = LOAD_FACTOR) -> tuple[int, str]:
    """The replica holding most of the prompt's `blocks` leading blocks (`matches`: replica -> blocks held) among
    those within the bounded-load bound, ties to the least outstanding; else today's choice (adapter affinity, or
    least outstanding). With the reason, for the answer's header: `prefix 12/14`, `spill` (replicas hold the
    prefix but are loaded beyond the bound), `adapter-affinity` or `least-outstanding`."""
    bound = bounded_load_bound(sum(outstanding.get(r, 0) for r in replicas), len(replicas), factor)
    within = {r: matches[r] for r in replicas if matches.get(r) and outstanding.get(r, 0) + 1 <= bound}
    if within:
        best = max(within.values())
        return least_outstanding([r for r in replicas if within.get(r) == best], outstanding, turn), \
            f"prefix {best}/{blocks}"
    if adapter is not None:
        chosen, reason = affinity_choice(adapter, replicas, outstanding, factor), "adapter-affinity"
    else:
        chosen, reason = least_outstanding(replicas, outstanding, turn), "least-outstanding"
    return chosen, "spill" if any(matches.get(r) for r in replicas) else reason


def predicted_choice(predicted: Mapping[int, float], matches: Mapping[int, int], blocks: int,
                     replicas: Sequence[int], outstanding: Mapping[int, int], turn: int = 0,
                     factor: float = LOAD_FACTOR) -> tuple[int, str]:
    """The replica with the lowest predicted time to first token (`predicted`, seconds; predict.py weighs what it
    has cached of the prompt and its load) among those within the bounded-load bound, so a hot prefix spills over
    too; near-ties to the one holding most of the prompt, then the least outstanding. With the reason: `prefix 12/14`
    (it holds that many of the prompt's leading blocks), `spill` (others hold some, this one none) or
    `least-outstanding`."""
    bound = bounded_load_bound(sum(outstanding.get(r, 0) for r in replicas), len(replicas), factor)
    within = [r for r in replicas if outstanding.get(r, 0) + 1 <= bound] or list(replicas)
    best = min(predicted[r] for r in within)
    near = [r for r in within if predicted[r] <= best * (1 + NEAR)]  # as good, within the predictor's error
    most = max(matches.get(r, 0) for r in near)
    chosen = least_outstanding([r for r in near if matches.get(r, 0) == most], outstanding, turn)
    if held := matches.get(chosen, 0):
        return chosen, f"prefix {held}/{blocks}"
    return chosen, "spill" if any(matches.get(r) for r in replicas) else "least-outstanding"
