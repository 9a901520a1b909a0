"""Sorted indexes of free space, so a placement is a binary search instead of a scan of every GPU.

Each index keeps (key, member) pairs sorted; the ledger tells the book which GPU changed and the book
re-sorts that GPU (or its whole host, for keys that depend on the host) in every index it belongs to.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable

from console.scheduler.ledger import Ledger

NONE_FREE = -(1 << 62)  # a host without enough eligible GPUs for a gang


class SortedIndex:
    """Members sorted by key; `refresh(member)` after the member's key may have changed."""

    def __init__(self, members: Iterable, key: Callable, host_scoped: bool = False) -> None:
        self.key = key
        self.host_scoped = host_scoped  # the key reads host-wide state: refresh the host's other GPUs too
        members = list(members)
        self.keys = dict(zip(members, map(key, members), strict=True))
        self.entries = sorted(zip(self.keys.values(), self.keys, strict=True))

    def refresh(self, member) -> None:
        old = self.keys.get(member)
        if old is None:
            return
        new = self.key(member)
        if new == old:
            return
        entries = self.entries
        del entries[bisect_left(entries, (old, member))]
        insort(entries, (new, member))
        self.keys[member] = new

    def position(self, key) -> int:
        """Where entries with keys >= `key` start."""
        return bisect_left(self.entries, (key,))


class IndexBook:
    """Lazily built indexes over one ledger, kept current by its change notifications."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._gpu_indexes: dict[Hashable, SortedIndex] = {}
        self._by_gpu: list[list[SortedIndex]] = [[] for _ in range(len(ledger))]
        self._host_indexes: dict[Hashable, SortedIndex] = {}
        self._by_host: dict[str, list[SortedIndex]] = {}
        self._listening = False  # subscribed at the first index: changes before it need no sorting

    def _listen(self) -> None:
        if not self._listening:
            self.ledger.listen(self._changed)
            self._listening = True

    def gpus(self, name: Hashable, members: list[int], key: Callable[[int], tuple], host_scoped: bool = False
             ) -> SortedIndex:
        """The index `name` over GPU numbers `members`, built on first use."""
        index = self._gpu_indexes.get(name)
        if index is None:
            self._listen()
            index = SortedIndex(members, key, host_scoped)
            self._gpu_indexes[name] = index
            for g in members:
                self._by_gpu[g].append(index)
        return index

    def hosts(self, name: Hashable, members: Iterable[str], key: Callable[[str], tuple]) -> SortedIndex:
        """The index `name` over host names, built on first use."""
        index = self._host_indexes.get(name)
        if index is None:
            self._listen()
            index = SortedIndex(members, key)
            self._host_indexes[name] = index
            for h in index.keys:
                self._by_host.setdefault(h, []).append(index)
        return index

    def close(self) -> None:
        """Forget the indexes: their keys are often a placer's bound methods, and the placer holds this book (a
        reference cycle that would leave a pass's units to the cyclic collector)."""
        self._gpu_indexes.clear()
        self._host_indexes.clear()
        self._by_gpu.clear()
        self._by_host.clear()

    def _changed(self, g: int) -> None:
        host = self.ledger.host[g]
        for index in self._by_gpu[g]:
            if index.host_scoped:
                for other in self.ledger.host_gpus[host]:
                    index.refresh(other)
            else:
                index.refresh(g)
        for index in self._by_host.get(host, ()):
            index.refresh(host)


def kth_free(ledger: Ledger, host: str, eligible: set[int] | None, width: int) -> int:
    """The free space of the `width`-th roomiest eligible GPU of `host`: the largest gang share it can take."""
    capacity, reserved = ledger.capacity, ledger.reserved
    gpus = ledger.host_gpus[host]
    frees = sorted([capacity[g] - reserved[g] for g in gpus if eligible is None or g in eligible], reverse=True)
    return frees[width - 1] if len(frees) >= width else NONE_FREE
