"""Where each LoRA adapter of one base-model worker lives: the policy of the adapter pool, without torch.

Three places, two of them budgeted in bytes at the serving dtype: the device tier ("gpu", where a
forward can use it), the host tier ("cpu", a copy away) and disk (re-read on next use). An adapter
is in exactly one place. The device tier evicts least recently used adapters to the host tier, the
host tier evicts to disk; pinned adapters stay on the device. Every method returns the `Move`s the
caller must carry out, in order, and has already counted them as done.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

GPU, CPU, DISK = "gpu", "cpu", "disk"
TIER_NAMES = {GPU: "device tier", CPU: "host tier"}


class AdapterRefused(ValueError):
    """A load, pin or batch the pool cannot take; the message says why in words an operator can act on."""


@dataclass(frozen=True)
class Move:
    name: str
    source: str  # GPU, CPU or DISK
    target: str


@dataclass
class AdapterState:
    name: str
    nbytes: int
    tier: str = DISK
    pinned: bool = False
    requests: int = 0  # rows that asked for it
    hits: int = 0  # batches that found it on the device
    misses: int = 0  # batches that had to swap it in
    last_used: int = 0  # logical clock of its last use, for LRU
    score: float = 0.0  # demand: requests and hints, halved every half-life
    scored_at: float = 0.0
    swap_ins: int = 0
    swap_seconds: float = 0.0  # total time of its swap-ins, measured by the caller
    last_swap_seconds: float = 0.0


@dataclass(frozen=True)
class PoolTotals:
    hits: int
    misses: int
    evictions: int  # device -> host demotions plus host -> disk drops
    disk_loads: int
    gpu_bytes: int
    gpu_budget: int
    cpu_bytes: int
    cpu_budget: int
    adapters: int


def mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


class AdapterTiers:
    """The two byte-budgeted tiers of one worker's adapters, LRU with pinning and demand-driven prefetch."""

    def __init__(self, gpu_budget: int, cpu_budget: int, *, half_life_s: float = 60.0) -> None:
        self.budgets = {GPU: int(gpu_budget), CPU: int(cpu_budget)}
        self.half_life_s = half_life_s
        self.adapters: dict[str, AdapterState] = {}
        self._clock = 0
        self._evictions = 0
        self._disk_loads = 0

    # -- what is where ---------------------------------------------------------------------------

    def used(self, tier: str) -> int:
        return sum(a.nbytes for a in self.adapters.values() if a.tier == tier)

    def free(self, tier: str) -> int:
        return self.budgets[tier] - self.used(tier)

    def tier_of(self, name: str) -> str:
        return self._get(name).tier

    # -- registration ----------------------------------------------------------------------------

    def add(self, name: str, nbytes: int, *, now: float | None = None) -> list[Move]:
        """Register an adapter read from disk: onto the device if it fits beside the others, else the host tier."""
        if name in self.adapters:
            raise AdapterRefused(f"adapter {name!r} is already loaded; unload it first")
        for tier in (GPU, CPU):
            if nbytes > self.budgets[tier]:
                raise AdapterRefused(
                    f"adapter {name!r} needs {mb(nbytes)}, more than the whole {TIER_NAMES[tier]} "
                    f"({mb(self.budgets[tier])}); raise that budget or serve a lower-rank adapter"
                )
        state = AdapterState(name, int(nbytes), scored_at=self._now(now))
        self.adapters[name] = state
        self._touch(state)
        moves: list[Move] = []
        if self.free(GPU) >= nbytes:
            self._move(state, GPU, moves)
        else:
            self._make_room(CPU, nbytes, protect={name}, moves=moves)
            self._move(state, CPU, moves)
        return moves

    def grow(self, gpu_budget: int, cpu_budget: int) -> dict[str, tuple[int, int]]:
        """Take larger budgets (the console granted the replica more: its adapters grew); returns each tier that
        grew as (before, after). A smaller budget is ignored: the scheduler never shrinks a running replica's
        reservation, so its pool keeps what it was given, and nothing is evicted for it."""
        grown = {}
        for tier, wanted in ((GPU, int(gpu_budget)), (CPU, int(cpu_budget))):
            if wanted > self.budgets[tier]:
                grown[tier] = (self.budgets[tier], wanted)
                self.budgets[tier] = wanted
        return grown

    def remove(self, name: str) -> str:
        """Forget an adapter; returns the tier whose memory the caller must free."""
        return self.adapters.pop(self._get(name).name).tier

    def lost(self, name: str) -> None:
        """The caller failed to carry out a move of `name`: it holds no copy, so count it as on disk."""
        if name in self.adapters:
            self.adapters[name].tier = DISK

    # -- pinning ---------------------------------------------------------------------------------

    def pin(self, name: str, *, now: float | None = None) -> list[Move]:
        """Keep an adapter on the device until unpinned; refused when the pinned ones would overfill it."""
        state = self._get(name)
        if state.pinned:
            return []
        pinned = sum(a.nbytes for a in self.adapters.values() if a.pinned)
        if pinned + state.nbytes > self.budgets[GPU]:
            raise AdapterRefused(
                f"cannot pin {name!r} ({mb(state.nbytes)}): {mb(pinned)} of the {mb(self.budgets[GPU])} device "
                "tier is already pinned; unpin another adapter or raise the device budget"
            )
        moves: list[Move] = []
        if state.tier != GPU:
            self._make_room(GPU, state.nbytes, protect={name}, moves=moves)
            self._move(state, GPU, moves)
        state.pinned = True
        self._touch(state)
        return moves

    def unpin(self, name: str) -> None:
        self._get(name).pinned = False

    # -- the model going to sleep --------------------------------------------------------------------

    def offload(self) -> list[Move]:
        """Every adapter off the device (its model is going to sleep): to the host tier while it has
        room, most recently used first, else to disk. Pins are kept, and honoured again by `restore`."""
        moves: list[Move] = []
        for state in sorted((a for a in self.adapters.values() if a.tier == GPU), key=lambda a: -a.last_used):
            self._move(state, CPU if self.free(CPU) >= state.nbytes else DISK, moves)
        return moves

    def restore(self) -> list[Move]:
        """Pinned adapters back onto the device (the model woke up); others come back on demand."""
        moves: list[Move] = []
        for state in self.adapters.values():
            if state.pinned and state.tier != GPU:
                self._make_room(GPU, state.nbytes, protect={state.name}, moves=moves)
                self._move(state, GPU, moves)
        return moves

    # -- serving ---------------------------------------------------------------------------------

    def acquire(self, names: Sequence[str | None], *, now: float | None = None) -> list[Move]:
        """Bring every adapter a batch names (one entry per row, None for none) onto the device together."""
        now = self._now(now)
        rows: dict[str, int] = {}
        for name in names:
            if name is not None:
                self._get(name)
                rows[name] = rows.get(name, 0) + 1
        needed = sum(self.adapters[n].nbytes for n in rows)
        pinned_elsewhere = [a for a in self.adapters.values() if a.pinned and a.name not in rows]
        held = sum(a.nbytes for a in pinned_elsewhere)
        if needed + held > self.budgets[GPU]:
            owners = ", ".join(sorted(a.name for a in pinned_elsewhere))
            pinned = f", {mb(held)} of it pinned by {owners}" if held else ""
            raise AdapterRefused(
                f"this batch needs {len(rows)} adapters ({', '.join(rows)}; {mb(needed)}) on the device at once; "
                f"the device tier holds {mb(self.budgets[GPU])}{pinned}; split the batch"
            )
        moves: list[Move] = []
        for name, count in rows.items():
            state = self.adapters[name]
            state.requests += count
            self._add_score(state, count, now)
            if state.tier == GPU:
                state.hits += 1
            else:
                state.misses += 1
                self._make_room(GPU, state.nbytes, protect=set(rows), moves=moves)
                self._move(state, GPU, moves)
            self._touch(state)
        return moves

    def hint(self, demand: Mapping[str, float], *, now: float | None = None) -> list[str]:
        """Add expected demand (e.g. from the console's routing) to adapters' scores; returns unknown names."""
        now = self._now(now)
        unknown = []
        for name, weight in demand.items():
            if name in self.adapters:
                self._add_score(self.adapters[name], float(weight), now)
            else:
                unknown.append(name)
        return unknown

    def prefetch(self, *, now: float | None = None) -> list[Move]:
        """Promote the most demanded adapters onto the device, evicting only less demanded unpinned ones."""
        now = self._now(now)
        for state in self.adapters.values():
            self._add_score(state, 0.0, now)
        waiting = sorted(
            (a for a in self.adapters.values() if a.tier != GPU and a.score > 0),
            key=lambda a: (-a.score, -a.last_used, a.name),
        )
        moves: list[Move] = []
        for state in waiting:
            victims = sorted(
                (a for a in self.adapters.values() if a.tier == GPU and not a.pinned and a.score < state.score),
                key=lambda a: (a.score, a.last_used, a.name),
            )
            room = self.free(GPU)
            chosen = []
            for victim in victims:
                if room >= state.nbytes:
                    break
                chosen.append(victim)
                room += victim.nbytes
            if room < state.nbytes:
                continue  # it would push out something at least as popular; a smaller one may still fit
            for victim in chosen:
                self._evict(victim, protect={state.name}, moves=moves)
            self._move(state, GPU, moves)
        return moves

    def record_swap(self, name: str, seconds: float) -> None:
        """Note how long the caller took to bring `name` onto the device."""
        state = self._get(name)
        state.swap_ins += 1
        state.swap_seconds += seconds
        state.last_swap_seconds = seconds

    # -- stats -----------------------------------------------------------------------------------

    def totals(self) -> PoolTotals:
        states = self.adapters.values()
        return PoolTotals(
            hits=sum(a.hits for a in states),
            misses=sum(a.misses for a in states),
            evictions=self._evictions,
            disk_loads=self._disk_loads,
            gpu_bytes=self.used(GPU),
            gpu_budget=self.budgets[GPU],
            cpu_bytes=self.used(CPU),
            cpu_budget=self.budgets[CPU],
            adapters=len(self.adapters),
        )

    def scores(self, *, now: float | None = None) -> dict[str, float]:
        """Every adapter's demand score, decayed to `now`."""
        now = self._now(now)
        for state in self.adapters.values():
            self._add_score(state, 0.0, now)
        return {name: a.score for name, a in self.adapters.items()}

    # -- internals -------------------------------------------------------------------------------

    def _get(self, name: str) -> AdapterState:
        try:
            return self.adapters[name]
        except KeyError:
            raise AdapterRefused(f"adapter {name!r} is not loaded in this pool") from None

    def _now(self, now: float | None) -> float:
        return time.monotonic() if now is None else now

    def _touch(self, state: AdapterState) -> None:
        self._clock += 1
        state.last_used = self._clock

    def _add_score(self, state: AdapterState, amount: float, now: float) -> None:
        elapsed = max(0.0, now - state.scored_at)
        state.score = state.score * math.pow(0.5, elapsed / self.half_life_s) + amount
        state.scored_at = now

    def _move(self, state: AdapterState, target: str, moves: list[Move]) -> None:
        if state.tier == DISK and target != DISK:
            self._disk_loads += 1
        moves.append(Move(state.name, state.tier, target))
        state.tier = target

    def _make_room(self, tier: str, nbytes: int, *, protect: Iterable[str], moves: list[Move]) -> None:
        """Evict least recently used unpinned adapters from `tier` until `nbytes` fit; the caller checked it can."""
        protect = set(protect)
        victims = sorted(
            (a for a in self.adapters.values() if a.tier == tier and not a.pinned and a.name not in protect),
            key=lambda a: (a.last_used, a.name),
        )
        for victim in victims:
            if self.free(tier) >= nbytes:
                return
            self._evict(victim, protect=protect, moves=moves)
        if self.free(tier) < nbytes:  # only reachable through a caller's bug: refuse rather than overfill
            raise AdapterRefused(f"the {TIER_NAMES[tier]} cannot make room for {mb(nbytes)}")

    def _evict(self, victim: AdapterState, *, protect: set[str], moves: list[Move]) -> None:
        """Device -> host (making room there first), host -> disk."""
        self._evictions += 1
        if victim.tier == GPU:
            # Room on the host comes from its LRU adapters, but never from one this batch is about to
            # promote; when only those are left, the victim goes straight to disk.
            evictable = sum(a.nbytes for a in self.adapters.values()
                            if a.tier == CPU and a.name not in protect)
            if self.free(CPU) + evictable >= victim.nbytes:
                self._make_room(CPU, victim.nbytes, protect=protect, moves=moves)
                self._move(victim, CPU, moves)
                return
        self._move(victim, DISK, moves)
