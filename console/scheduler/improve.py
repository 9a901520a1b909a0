"""Memory-optimized's improvement search: repack one priority class's replicas to place more than best-fit decreasing.

Both of its moves refill GPUs with an exact subset sum (a bitset dynamic program over Python integers):
1. minimum bin slack: fill the GPUs one at a time, largest first, each with the subset of the remaining
   replicas that leaves it the least free space, the largest remaining replica forced in;
2. local search: pool the replicas of two to four GPUs with some unplaced ones and refill those GPUs the
   same way (random order, sometimes a shuffled pool); keep the result when it places more replicas, or
   as many with free space gathered on fewer GPUs (a larger sum of squared loads), so the search walks
   across plateaus towards a GPU with room for one more. One step in ten fills with the smallest
   replicas instead, which places more of them when a large one blocks several small ones. The best
   solution seen is returned.
Sizes are counted in units: the greatest common divisor of all sizes and capacities when that gives at
most 2**18 units per GPU, else 1/131072 of the largest capacity, sizes rounded up and capacities down,
so a solution never overcommits. It stops when all are placed, when a counting bound shows no more can
be, after STALL_ITERATIONS steps without a better solution, at the deadline (a time.perf_counter value)
or after `max_iterations`.
"""

from __future__ import annotations

import random
from math import gcd
from time import perf_counter

EXACT_UNITS = 1 << 18
COARSE_UNITS = 1 << 17
GLOBAL_LIMIT = (2000, 400)  # items, GPUs: above this the first (global) pass is skipped
STALL_ITERATIONS = 4000  # steps without a better solution before the search gives up
POOL_UNPLACED = 24  # unplaced replicas joining one local step, besides the one it aims at


def size_unit(capacities: list[int], sizes: list[int]) -> int:
    """The byte granularity of the dynamic program (see the module docstring)."""
    g = 0
    for x in sizes:
        g = gcd(g, x)
    for c in capacities:
        if c > 0:
            g = gcd(g, c)
    top = max(capacities, default=0)
    if g and top // g <= EXACT_UNITS:
        return g
    return max(1, -(-top // COARSE_UNITS))


def best_subset(weights: list[int], cap: int) -> list[int]:
    """Positions of a subset with the largest sum <= cap; earlier positions are preferred on ties."""
    if cap <= 0 or not weights:
        return []
    mask, full = (1 << (cap + 1)) - 1, 1 << cap
    reach, history = 1, [1]
    for w in weights:
        reach = (reach | (reach << w)) & mask
        history.append(reach)
        if reach & full:
            break  # a perfect fill: later items cannot improve it
    s = reach.bit_length() - 1
    chosen = []
    for i in range(len(history) - 2, -1, -1):
        if not (history[i] >> s) & 1:
            chosen.append(i)
            s -= weights[i]
    return chosen


class Repack:
    """One class's repacking problem: bins (GPUs) with capacities, items (replicas) with eligible bins."""

    def __init__(self, capacities: list[int], sizes: list[int], eligible: list[set[int] | None],
                 assign: list[int | None], seed: int) -> None:
        unit = size_unit(capacities, sizes)
        self.w = [-(-s // unit) for s in sizes]
        self.cap = [max(c, 0) // unit for c in capacities]
        self.size = sizes
        self.eligible = eligible
        self.assign = list(assign)
        self.rng = random.Random(seed)
        self.content: list[list[int]] = [[] for _ in capacities]
        self.load = [0] * len(capacities)
        for i, b in enumerate(assign):
            if b is not None:
                self.content[b].append(i)
                self.load[b] += self.w[i]
        # Rounding may make a valid placement look full past capacity: such GPUs are left alone.
        self.open = [b for b in range(len(capacities)) if self.load[b] <= self.cap[b]]
        self.open_set = open_set = set(self.open)
        # Bins and the largest capacity per eligible set (replicas without a selector share None): an item that
        # exceeds the largest capacity of its bins is hopeless.
        shared: dict[int | None, tuple[list[int], int]] = {}
        self.bins_of, tops = [], []
        for e in eligible:
            key = None if e is None else id(e)
            found = shared.get(key)
            if found is None:
                bins = sorted(open_set if e is None else e & open_set)
                found = shared[key] = (bins, max((self.cap[b] for b in bins), default=-1))
            self.bins_of.append(found[0])
            tops.append(found[1])
        self.hopeless = {i for i in range(len(sizes)) if self.w[i] > tops[i]}
        self.bound = self._count_bound()

    def placed(self) -> tuple[int, int]:
        """(replicas placed, bytes placed) of the current solution."""
        done = [i for i, b in enumerate(self.assign) if b is not None]
        return len(done), sum(self.size[i] for i in done)

    def _count_bound(self) -> int:
        """At most this many can be placed: the smallest candidates that fit in all open capacity together."""
        open_set = self.open_set
        fixed = sum(1 for b in self.assign if b is not None and b not in open_set)
        room = sum(self.cap[b] for b in self.open)
        n = fixed
        for w in sorted(self.w[i] for i, b in enumerate(self.assign)
                        if i not in self.hopeless and (b is None or b in open_set)):
            if w > room:
                break
            room -= w
            n += 1
        return n

    def fill(self, bins: list[int], pool: list[int], forced: bool, shuffle: bool, fewest: bool = False
             ) -> dict[int, int]:
        """Refill `bins` in order from `pool`: item -> bin for those placed.

        Each GPU gets the subset of the largest sum (the largest remaining replica forced in when `forced`),
        or with `fewest`, the smallest replicas while they fit (the most replicas one GPU can take).
        """
        order = sorted(pool, key=lambda i: -self.w[i])
        if shuffle:
            self.rng.shuffle(order)
        left, result = set(order), {}
        for b in bins:
            cap = self.cap[b]
            cands = [i for i in order if i in left and self.w[i] <= cap
                     and (self.eligible[i] is None or b in self.eligible[i])]
            picked = []
            if fewest:
                for i in sorted(cands, key=lambda i: self.w[i]):
                    if self.w[i] > cap:
                        break
                    picked.append(i)
                    cap -= self.w[i]
                cands = []
            elif forced and cands:
                first = max(cands, key=lambda i: self.w[i])
                cands.remove(first)
                picked.append(first)
                cap -= self.w[first]
            picked += [cands[j] for j in best_subset([self.w[i] for i in cands], cap)]
            for i in picked:
                result[i] = b
                left.discard(i)
        return result

    def apply(self, bins: list[int], pool: list[int], result: dict[int, int]) -> None:
        for b in bins:
            self.content[b] = []
            self.load[b] = 0
        for i in pool:
            b = result.get(i)
            self.assign[i] = b
            if b is not None:
                self.content[b].append(i)
                self.load[b] += self.w[i]

    def run(self, deadline: float, max_iterations: int | None) -> tuple[list[int | None], int, str]:
        """Search; returns (best assignment, iterations, why it stopped)."""
        best, best_score = list(self.assign), self.placed()
        n, iterations = len(self.w), 0
        if best_score[0] >= self.bound:
            return best, 0, "all placed" if best_score[0] == n else "bound"
        if n <= GLOBAL_LIMIT[0] and len(self.open) <= GLOBAL_LIMIT[1]:
            pool = [i for i, b in enumerate(self.assign) if b is None or b in self.open_set]
            bins = sorted(self.open, key=lambda b: (-self.cap[b], b))
            for forced in (True, False):
                result = self.fill(bins, pool, forced, shuffle=False)
                if (len(result), sum(self.size[i] for i in result)) > self._score(pool):
                    self.apply(bins, pool, result)
            score = self.placed()
            if score > best_score:
                best, best_score = list(self.assign), score
        stopped, since_best = "bound", 0
        while best_score[0] < self.bound:
            if since_best >= STALL_ITERATIONS:
                stopped = "stalled"
                break
            if max_iterations is not None and iterations >= max_iterations:
                stopped = "iteration budget"
                break
            if perf_counter() >= deadline:
                stopped = "time budget"
                break
            iterations += 1
            since_best += 1
            if self._step():
                score = self.placed()
                if score > best_score:
                    best, best_score, since_best = list(self.assign), score, 0
        if best_score[0] == n:
            stopped = "all placed"
        return best, iterations, stopped

    def _score(self, pool: list[int]) -> tuple[int, int]:
        done = [i for i in pool if self.assign[i] is not None]
        return len(done), sum(self.size[i] for i in done)

    def _step(self) -> bool:
        rng = self.rng
        waiting = [i for i, b in enumerate(self.assign) if b is None and i not in self.hopeless]
        if not waiting:
            return False
        target = rng.choice(waiting)
        homes = self.bins_of[target]
        sample = homes if len(homes) <= 16 else rng.sample(homes, 16)
        first = max(sample, key=lambda b: (self.cap[b] - self.load[b], rng.random()))
        r = rng.choice((2, 2, 3, 3, 4))
        others = homes if len(homes) <= 32 else rng.sample(homes, 32)
        if rng.random() < 0.5:  # half the time, only GPUs with free space join: they are what must merge
            others = [b for b in others if self.load[b] < self.cap[b]] or others
        bins = [first] + [b for b in rng.sample(others, min(len(others), r)) if b != first][: r - 1]
        chosen = set(bins)
        mates = [i for i in waiting if i != target and any(b in chosen for b in self.bins_of[i])]
        if len(mates) > POOL_UNPLACED:
            mates = rng.sample(mates, POOL_UNPLACED)
        pool = [i for b in bins for i in self.content[b]] + [target] + mates
        # Equal counts: prefer fuller GPUs and emptier ones (sum of squared loads), which gathers free space.
        before = (sum(len(self.content[b]) for b in bins), sum(self.load[b] ** 2 for b in bins))
        rng.shuffle(bins)
        kind = rng.random()
        result = self.fill(bins, pool, forced=kind < 0.45, shuffle=rng.random() < 0.3, fewest=kind > 0.9)
        loads = dict.fromkeys(bins, 0)
        for i, b in result.items():
            loads[b] += self.w[i]
        after = (len(result), sum(v * v for v in loads.values()))
        if after >= before:
            self.apply(bins, pool, result)
            return True
        return False
