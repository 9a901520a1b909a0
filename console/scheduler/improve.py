"""Memory-optimized's improvement search: repack one priority class's replicas to place more than best-fit decreasing.

Both of its moves refill GPUs with a subset sum (a bitset dynamic program over Python integers):
1. minimum bin slack: fill the GPUs one at a time, largest first, each with the subset of the remaining
   replicas that leaves it the least free space, the largest remaining replica forced in;
2. local search: pool the replicas of two to four GPUs with some unplaced ones and refill those GPUs the
   same way (random order, sometimes a shuffled pool); keep the result when it places more replicas, or
   as many with free space gathered on fewer GPUs (a larger sum of squared loads), so the search walks
   across plateaus towards a GPU with room for one more. One step in ten fills with the smallest
   replicas instead, which places more of them when a large one blocks several small ones. The best
   solution seen is returned.
The dynamic program counts in units: the greatest common divisor of all sizes and capacities when that gives
at most 2**18 units per GPU (exact), else 1/131072 of the largest capacity (coarse). Coarse units round sizes
down, so every subset that fits in bytes also fits in units and a GPU the optimum fills to the byte can be
filled; the subset it picks is then verified in exact bytes (exact_subset: the subsets of the best unit sums
are enumerated, the one with the largest byte sum that fits wins, a perfect fill ends the enumeration) and
topped up with any replica that still fits in bytes. Everything else (free space, loads, the counting bound)
is in bytes, so a solution never overcommits a GPU by a byte.
It stops when all are placed, when a counting bound shows no more can be, after STALL_ITERATIONS steps
without a better solution, at the deadline (a time.perf_counter value) or after `max_iterations`.
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
SUBSET_BUDGET = 20_000  # steps of one exact_subset enumeration (bounds the time of one refill)


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


def _reach(weights: list[int], cap: int, stop_when_full: bool) -> list[int]:
    """history[i]: the bitset of unit sums <= cap that the first i weights reach."""
    mask, full = (1 << (cap + 1)) - 1, 1 << cap
    reach, history = 1, [1]
    for w in weights:
        reach = (reach | (reach << w)) & mask
        history.append(reach)
        if stop_when_full and reach & full:
            break  # a perfect fill: later items cannot improve it
    return history


def best_subset(weights: list[int], cap: int) -> list[int]:
    """Positions of a subset with the largest sum <= cap; earlier positions are preferred on ties."""
    if cap <= 0 or not weights:
        return []
    history = _reach(weights, cap, True)
    s = history[-1].bit_length() - 1
    chosen = []
    for i in range(len(history) - 2, -1, -1):
        if not (history[i] >> s) & 1:
            chosen.append(i)
            s -= weights[i]
    return chosen


def exact_subset(sizes: list[int], unit: int, limit: int, budget: int = SUBSET_BUDGET) -> list[int]:
    """Positions of a subset of `sizes` (bytes) whose sum fits in `limit` bytes, searched in units of `unit` bytes.

    Sizes are rounded down to units, so every subset that fits in bytes is among those the dynamic program reaches,
    the subsets that fill `limit` to the byte included: their unit sums lie within `most` (the most replicas that
    fit) of the capacity in units. Those unit sums are searched first for a subset that fills `limit` exactly
    (depth first through the program's history, within `budget` steps). Failing that, the largest unit sum whose
    subset (earlier positions preferred) fits in bytes: at most `most` unit sums below the largest reachable one.
    """
    if limit <= 0 or not sizes:
        return []
    weights = [s // unit for s in sizes]
    cap = limit // unit
    history = _reach(weights, cap, False)
    most, room = 0, limit
    for size in sorted(sizes):
        if size > room:
            break
        room -= size
        most += 1
    top = history[-1]
    found = _perfect(sizes, weights, unit, limit, history, most, budget)
    if found is not None:
        return found
    for level in range(top.bit_length() - 1, -1, -1):
        if not (top >> level) & 1:
            continue
        chosen, s, got = [], level, 0
        for i in range(len(history) - 2, -1, -1):
            if not (history[i] >> s) & 1:
                chosen.append(i)
                s -= weights[i]
                got += sizes[i]
        if got <= limit:  # certain once level * unit + most * (unit - 1) <= limit
            return chosen
    return []


def _perfect(sizes: list[int], weights: list[int], unit: int, limit: int, history: list[int], most: int,
             budget: int) -> list[int] | None:
    """A subset of `sizes` summing to `limit` exactly, or None when none is found within `budget` steps."""
    n, cap = len(sizes), limit // unit
    width = (cap >> 3) + 1
    # A bit test on bytes is one step, on an int a copy of it: each position's bitset is converted when first read.
    bits: list[bytes | None] = [None] * (n + 1)
    where: dict[int, list[int]] = {}  # size -> its positions: the last replica of a fill is looked up, not searched
    for i, size in enumerate(sizes):
        where.setdefault(size, []).append(i)
    spread = unit - 1  # what rounding down took from one size, at most
    steps, top = 0, history[-1]
    for level in range(cap, max(cap - most, -1), -1):
        if not (top >> level) & 1:
            continue
        # Depth first: (last position still open, unit sum still to make, bytes so far, positions chosen).
        stack: list[tuple[int, int, int, tuple[int, ...]]] = [(n - 1, level, 0, ())]
        while stack:
            i, r, got, chosen = stack.pop()
            need, left = limit - got, most - len(chosen)
            for j in where.get(need, ()):
                if j <= i and weights[j] == r:
                    return [*chosen, j]
            if left <= 1:
                continue
            j = i
            options = []
            while j >= 0:  # j: the next position taken; those between it and i are left out
                steps += 1
                reach = bits[j]
                if reach is None:
                    reach = bits[j] = history[j].to_bytes(width, "little")
                rest = r - weights[j]
                if rest >= 0 and (reach[rest >> 3] >> (rest & 7)) & 1:
                    after = need - sizes[j]
                    if rest * unit <= after <= rest * unit + (left - 1) * spread:
                        options.append((j - 1, rest, got + sizes[j], (*chosen, j)))
                if not (reach[r >> 3] >> (r & 7)) & 1:
                    break  # the first j positions cannot make r: position j must be taken
                j -= 1
            stack.extend(options)  # popped last-in: the earliest position is tried first
            if steps >= budget:
                return None
    return None


class Repack:
    """One class's repacking problem: bins (GPUs) with capacities, items (replicas) with eligible bins."""

    def __init__(self, capacities: list[int], sizes: list[int], eligible: list[set[int] | None],
                 assign: list[int | None], seed: int, subset_budget: int = SUBSET_BUDGET) -> None:
        self.unit = unit = size_unit(capacities, sizes)
        # Exact: every size and capacity is a whole number of units, so unit sums are byte sums.
        self.exact = all(s % unit == 0 for s in sizes) and all(c % unit == 0 for c in capacities if c > 0)
        self.w = [s // unit for s in sizes]  # rounded down (exactly divided when exact)
        self.room = [max(c, 0) for c in capacities]  # bytes
        self.size = sizes
        self.subset_budget = subset_budget
        self.deadline = float("inf")  # set by run()
        self.assign, self.initial = list(assign), list(assign)  # initial: what verified() never takes away
        self.eligible = eligible
        self.rng = random.Random(seed)
        self.content: list[list[int]] = [[] for _ in capacities]
        self.load = [0] * len(capacities)  # bytes
        for i, b in enumerate(assign):
            if b is not None:
                self.content[b].append(i)
                self.load[b] += sizes[i]
        # A GPU already past its capacity (a placement the caller could not keep) is left alone.
        self.open = [b for b in range(len(capacities)) if self.load[b] <= self.room[b]]
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
                found = shared[key] = (bins, max((self.room[b] for b in bins), default=-1))
            self.bins_of.append(found[0])
            tops.append(found[1])
        self.hopeless = {i for i in range(len(sizes)) if sizes[i] > tops[i]}
        self.bound = self._count_bound()

    def placed(self) -> tuple[int, int]:
        """(replicas placed, bytes placed) of the current solution."""
        done = [i for i, b in enumerate(self.assign) if b is not None]
        return len(done), sum(self.size[i] for i in done)

    def _count_bound(self) -> int:
        """At most this many can be placed: the smallest candidates that fit in all open capacity together."""
        open_set = self.open_set
        fixed = sum(1 for b in self.assign if b is not None and b not in open_set)
        room = sum(self.room[b] for b in self.open)
        n = fixed
        for s in sorted(self.size[i] for i, b in enumerate(self.assign)
                        if i not in self.hopeless and (b is None or b in open_set)):
            if s > room:
                break
            room -= s
            n += 1
        return n

    def subset(self, cands: list[int], room: int) -> list[int]:
        """The items of `cands` (largest first) to put in `room` bytes: the largest sum that fits."""
        if self.exact:
            return [cands[j] for j in best_subset([self.w[i] for i in cands], room // self.unit)]
        size = self.size
        picked = [cands[j] for j in exact_subset([size[i] for i in cands], self.unit, room, self.subset_budget)]
        room -= sum(size[i] for i in picked)
        if room > 0:  # top up, in bytes, with what the enumeration's budget left out
            taken = set(picked)
            for i in cands:
                if i not in taken and size[i] <= room:
                    picked.append(i)
                    room -= size[i]
        return picked

    def fill(self, bins: list[int], pool: list[int], forced: bool, shuffle: bool, fewest: bool = False
             ) -> dict[int, int]:
        """Refill `bins` in order from `pool`: item -> bin for those placed.

        Each GPU gets the subset of the largest sum (the largest remaining replica forced in when `forced`),
        or with `fewest`, the smallest replicas while they fit (the most replicas one GPU can take).
        """
        size = self.size
        order = sorted(pool, key=lambda i: -size[i])
        if shuffle:
            self.rng.shuffle(order)
        left, result = set(order), {}
        for b in bins:
            if perf_counter() >= self.deadline:  # the first pass refills every GPU: it stops at the deadline too
                break
            room = self.room[b]
            cands = [i for i in order if i in left and size[i] <= room
                     and (self.eligible[i] is None or b in self.eligible[i])]
            picked = []
            if fewest:
                for i in sorted(cands, key=lambda i: size[i]):
                    if size[i] > room:
                        break
                    picked.append(i)
                    room -= size[i]
                cands = []
            elif forced and cands:
                first = max(cands, key=lambda i: size[i])
                cands.remove(first)
                picked.append(first)
                room -= size[first]
            if cands:
                picked += self.subset(cands, room)
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
                self.load[b] += self.size[i]

    def verified(self, assign: list[int | None]) -> list[int | None]:
        """`assign` checked in bytes, and repaired where a GPU would be past its capacity: the replicas the search
        put there leave it, largest first, until it fits (a safeguard: every refill is checked in bytes)."""
        loads = [0] * len(self.room)
        for i, b in enumerate(assign):
            if b is not None:
                loads[b] += self.size[i]
        over = [b for b in self.open if loads[b] > self.room[b]]
        if not over:
            return assign
        repaired = list(assign)
        for b in over:
            added = sorted((i for i, a in enumerate(assign) if a == b and self.initial[i] != b),
                           key=lambda i: -self.size[i])
            for i in added:
                if loads[b] <= self.room[b]:
                    break
                repaired[i] = None
                loads[b] -= self.size[i]
        return repaired

    def run(self, deadline: float, max_iterations: int | None) -> tuple[list[int | None], int, str]:
        """Search; returns (the best assignment, verified in bytes; iterations; why it stopped)."""
        self.deadline = deadline
        best, iterations, stopped = self._run(deadline, max_iterations)
        return self.verified(best), iterations, stopped

    def _run(self, deadline: float, max_iterations: int | None) -> tuple[list[int | None], int, str]:
        best, best_score = list(self.assign), self.placed()
        n, iterations = len(self.w), 0
        if best_score[0] >= self.bound:
            return best, 0, "all placed" if best_score[0] == n else "bound"
        if n <= GLOBAL_LIMIT[0] and len(self.open) <= GLOBAL_LIMIT[1]:
            pool = [i for i, b in enumerate(self.assign) if b is None or b in self.open_set]
            bins = sorted(self.open, key=lambda b: (-self.room[b], b))
            for forced in (True, False):
                result = self.fill(bins, pool, forced, shuffle=False)
                if (len(result), sum(self.size[i] for i in result)) > self._score(pool):
                    self.apply(bins, pool, result)
                if self.placed()[0] >= self.bound:
                    break
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
        first = max(sample, key=lambda b: (self.room[b] - self.load[b], rng.random()))
        r = rng.choice((2, 2, 3, 3, 4))
        others = homes if len(homes) <= 32 else rng.sample(homes, 32)
        if rng.random() < 0.5:  # half the time, only GPUs with free space join: they are what must merge
            others = [b for b in others if self.load[b] < self.room[b]] or others
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
            loads[b] += self.size[i]
        after = (len(result), sum(v * v for v in loads.values()))
        if after >= before:
            self.apply(bins, pool, result)
            return True
        return False
