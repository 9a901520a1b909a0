"""The reservation ledger: free = total - foreign use - reservations - buffer, per GPU, never overcommitted.

A reservation is the only thing that claims memory for ModelGrid; a live reading enters only as the
foreign use the caller passes in, so it can never replace or shrink a reservation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import sub
from typing import TYPE_CHECKING

from console.scheduler.spread import ZONE
from console.scheduler.types import ANY_VALUE, Gpu

if TYPE_CHECKING:
    from console.scheduler.units import Unit

SelectorKey = tuple  # (frozenset of required (label, value) pairs, frozenset of tolerated (taint, value) pairs)


class OvercommitError(RuntimeError):
    """A reservation that would exceed a GPU's free space: a bug in the planner, never a user error."""


NO_SELECTOR: SelectorKey = (frozenset(), frozenset())


def selector_key(selector: Mapping[str, str], tolerations: Mapping[str, str] | None = None) -> SelectorKey:
    """A hashable form of a label selector and the taints it tolerates."""
    if not selector and not tolerations:
        return NO_SELECTOR
    return frozenset(selector.items()), frozenset((tolerations or {}).items())


def tolerated(taints: Mapping[str, str], tolerations: frozenset) -> bool:
    """Whether every taint (key, value) is tolerated, by its value or by "*"."""
    return all((k, v) in tolerations or (k, ANY_VALUE) in tolerations for k, v in taints.items())


def matches(gpu: Gpu, key: SelectorKey) -> bool:
    """Whether `gpu` carries every label of the selector and each of its taints is tolerated."""
    selector, tolerations = key
    return all(gpu.labels.get(k) == v for k, v in selector) and (not gpu.taints or tolerated(gpu.taints, tolerations))


class Ledger:
    """GPU capacities and ModelGrid's reservations on them, numbered 0..n-1 for speed."""

    def __init__(self, gpus: Sequence[Gpu], buffer_bytes: int) -> None:
        self.gpus = list(gpus)
        self.buffer = buffer_bytes
        self.ids = [g.id for g in self.gpus]
        self.number = {g.id: i for i, g in enumerate(self.gpus)}
        self.host = [g.host for g in self.gpus]
        self.zone = [g.labels.get(ZONE) for g in self.gpus]
        # What ModelGrid may reserve in all: may be negative when foreign use ate the buffer.
        self.capacity = [g.total_bytes - g.used_bytes - buffer_bytes for g in self.gpus]
        self.reserved = [0] * len(self.gpus)
        self.holders: list[list[Unit]] = [[] for _ in self.gpus]
        self.host_gpus: dict[str, list[int]] = {}
        self.slot = []  # position of each GPU on its host: 0 for the first
        for i, g in enumerate(self.gpus):
            self.slot.append(len(self.host_gpus.setdefault(g.host, [])))
            self.host_gpus[g.host].append(i)
        # Bytes held per GPU by each tier (critical..batch): preemption skips GPUs without enough below a tier.
        self.tier_bytes = [[0, 0, 0, 0] for _ in self.gpus]
        self.releases = 0  # counts releases: a replica that failed before any later release fails again
        self.host_ready: dict[str, int] = dict.fromkeys(self.host_gpus, 0)  # ready replicas per host
        self.tainted = any(g.taints for g in self.gpus)
        self._eligible: dict[SelectorKey, list[int]] = {}
        self._eligible_sets: dict[SelectorKey, set[int]] = {}
        self._listeners: list[Callable[[int], None]] = []

    def __len__(self) -> int:
        return len(self.gpus)

    def free(self, g: int) -> int:
        """Bytes still reservable on GPU number g."""
        return self.capacity[g] - self.reserved[g]

    def listen(self, callback: Callable[[int], None]) -> None:
        """Call `callback(g)` after every change of GPU g (indexes keep themselves sorted this way)."""
        self._listeners.append(callback)

    def close(self) -> None:
        """Forget the listeners (the indexes over this ledger), which refer back to it."""
        self._listeners.clear()

    def eligible(self, key: SelectorKey) -> list[int]:
        """GPU numbers whose labels satisfy a selector and whose taints it tolerates."""
        found = self._eligible.get(key)
        if found is None:
            if key == NO_SELECTOR and not self.tainted:
                found = list(range(len(self.gpus)))
            else:
                found = [i for i, g in enumerate(self.gpus) if matches(g, key)]
            self._eligible[key] = found
        return found

    def restricts(self, key: SelectorKey) -> bool:
        """Whether some GPU is not eligible under `key` (else every GPU is)."""
        return len(self.eligible(key)) < len(self.gpus)

    def exclusions(self, key: SelectorKey) -> tuple[int, dict[str, int]]:
        """GPUs `key` excludes: (how many lack a label of its selector, {"taint=value": GPUs it alone excludes})."""
        selector, tolerations = key
        by_label, by_taint = 0, {}
        for g in self.gpus:
            if not all(g.labels.get(k) == v for k, v in selector):
                by_label += 1
                continue
            for k, v in g.taints.items():
                if (k, v) not in tolerations and (k, ANY_VALUE) not in tolerations:
                    by_taint[f"{k}={v}"] = by_taint.get(f"{k}={v}", 0) + 1
                    break
        return by_label, by_taint

    def eligible_set(self, key: SelectorKey) -> set[int]:
        """`eligible(key)` as a set."""
        found = self._eligible_sets.get(key)
        if found is None:
            found = self._eligible_sets[key] = set(self.eligible(key))
        return found

    def reserve(self, unit: Unit, gpus: Iterable[int]) -> None:
        """Hold `unit.share` bytes on each of `gpus` for `unit`; refuses to overcommit."""
        gpus = tuple(gpus)
        for g in gpus:
            if self.free(g) < unit.share:
                raise OvercommitError(f"{unit.label} needs {unit.share} B on {self.ids[g]}, {self.free(g)} B free")
        rank = unit.demand.rank
        for g in gpus:
            self.reserved[g] += unit.share
            self.holders[g].append(unit)
            self.tier_bytes[g][rank] += unit.share
        unit.gpus = gpus
        if gpus:
            self.host_ready[self.host[gpus[0]]] += 1
        if self._listeners:
            for g in gpus:
                for callback in self._listeners:
                    callback(g)

    def hold(self, kept: list[tuple[Unit, int]]) -> None:
        """Reserve each unit on its one GPU as `reserve` does, in one step, unchecked and unannounced: a re-plan's
        replicas kept where they were, before the pass begins (units._existing_units; keep_existing checks them)."""
        reserved, holders, tier_bytes, host, host_ready = (self.reserved, self.holders, self.tier_bytes, self.host,
                                                           self.host_ready)
        for u, g in kept:
            size = u.share
            reserved[g] += size
            holders[g].append(u)
            tier_bytes[g][u.demand.rank] += size
            host_ready[host[g]] += 1

    def take_back(self, g: int) -> list[Unit]:
        """Empty GPU g of what `hold` put there, unannounced and not counted as a release: what it held, in order."""
        units, self.holders[g] = self.holders[g], []
        for u in units:
            self.tier_bytes[g][u.demand.rank] -= u.share
            self.host_ready[self.host[g]] -= 1
        self.reserved[g] = 0
        return units

    def release(self, unit: Unit) -> None:
        """Give back what `unit` holds."""
        gpus, unit.gpus = unit.gpus, ()
        self.releases += 1
        for g in gpus:
            self.reserved[g] -= unit.share
            self.holders[g].remove(unit)
            self.tier_bytes[g][unit.demand.rank] -= unit.share
        if gpus:
            self.host_ready[self.host[gpus[0]]] -= 1
        if self._listeners:
            for g in gpus:
                for callback in self._listeners:
                    callback(g)

    def frees(self) -> list[int]:
        """`free(g)` of every GPU, in one step (scans of every GPU read this instead)."""
        return list(map(sub, self.capacity, self.reserved))

    def freeable(self, g: int, rank: int) -> int:
        """Free bytes of GPU g plus what replicas of tier `rank` and below hold there."""
        return self.capacity[g] - self.reserved[g] + sum(self.tier_bytes[g][rank:])

    def freeables(self, rank: int) -> list[int]:
        """`freeable(g, rank)` of every GPU, in one step: what a higher tier could hold there."""
        # Every reservation counts in one tier, so what the tiers above `rank` hold is all that stays.
        if rank == 0:
            return list(self.capacity)
        if rank == 1:
            return [c - t[0] for c, t in zip(self.capacity, self.tier_bytes, strict=True)]
        if rank == 2:
            return [c - t[0] - t[1] for c, t in zip(self.capacity, self.tier_bytes, strict=True)]
        return [c - t[0] - t[1] - t[2] for c, t in zip(self.capacity, self.tier_bytes, strict=True)]

    def largest_free(self, gpus: Iterable[int]) -> tuple[int, str] | None:
        """(free bytes, GPU id) of the roomiest of `gpus` (the first of equals), or None when there are none."""
        gpus = list(gpus)
        if not gpus:
            return None
        frees = self.frees()
        best = max(gpus, key=frees.__getitem__)
        return frees[best], self.ids[best]
