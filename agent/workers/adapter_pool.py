"""The LoRA adapters of one base-model worker: tiers, slots and the multi-LoRA layers they feed (imports torch).

    pool = AdapterPool(model, gpu_budget=256 << 20, cpu_budget=2 << 30, base=inspect_model_dir(path))
    pool.load("support-bot", "/adapters/support-bot")
    with pool.serving(["support-bot", None, "legal"]):   # one adapter name, or None, per row
        logits = model(input_ids=ids).logits

Rows may come in any order; a batch whose rows are grouped by adapter spares
every layer a gather and a scatter.

`AdapterTiers` decides what lives where; this class carries its moves out on tensors: reading from
safetensors, copying between host (pinned when CUDA is there) and device, and handing each adapter
on the device a slot of the model's `AdapterSlots`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agent.artifacts import ModelArtifact
from agent.artifacts.adapters import AdapterArtifact, check_adapter_matches, read_adapter_dir
from agent.workers.adapter_tiers import CPU, DISK, GPU, AdapterTiers, Move
from agent.workers.adapter_weights import PackedAdapter, PackedLayer, plan_layout, read_packed
from agent.workers.lora import AdapterSlots, attach_multi_lora


class AdapterPool:
    """Byte-budgeted device and host tiers of LoRA adapters for one model, serving mixed-adapter batches."""

    def __init__(
        self,
        model: nn.Module,
        *,
        gpu_budget: int,
        cpu_budget: int,
        base: ModelArtifact | None = None,
        targets: Iterable[str] | None = None,
        half_life_s: float = 60.0,
    ) -> None:
        """Wrap `model`'s linear layers (all but the output head, or `targets`); `base` enables the shape check."""
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.dtype_name = str(self.dtype).removeprefix("torch.")
        self.base = base
        self.slots: AdapterSlots = attach_multi_lora(model, targets)
        self.tiers = AdapterTiers(gpu_budget, cpu_budget, half_life_s=half_life_s)
        # Pinned host memory makes host->GPU copies asynchronous and about twice as fast; on a CPU-only
        # worker there is nothing to pin for.
        self._pin = self.device.type == "cuda"
        self._layer_shapes = {n: (layer.in_features, layer.out_features) for n, layer in self.slots.layers.items()}
        self._artifacts: dict[str, AdapterArtifact] = {}
        self._layouts: dict[str, tuple[PackedLayer, ...]] = {}
        self._host: dict[str, PackedAdapter] = {}
        self._device: dict[str, PackedAdapter] = {}
        self._slot_of: dict[str, int] = {}
        self.swap_seconds: deque[float] = deque(maxlen=1000)  # recent swap-ins, for percentiles

    # -- lifecycle -------------------------------------------------------------------------------

    def load(self, name: str, path: str | Path, *, pin: bool = False) -> dict[str, Any]:
        """Validate and read an adapter directory into the pool; returns its stats row."""
        known = self._artifacts.get(name)
        if known is not None and known.path == Path(path).expanduser().resolve():
            # Already held (the agent re-sends its whole list): nothing is read from disk again.
            if pin:
                self.pin(name)
            return self.stats_of(name)
        artifact = read_adapter_dir(path)
        if self.base is not None:
            check_adapter_matches(artifact, self.base, self.dtype_name)
        layout = plan_layout(artifact, self._layer_shapes)
        moves = self.tiers.add(name, artifact.bytes_at(self.dtype_name))
        self._artifacts[name], self._layouts[name] = artifact, layout
        try:
            self._apply(moves)
            if pin:
                self._apply(self.tiers.pin(name))
        except BaseException:
            self.unload(name)
            raise
        return self.stats_of(name)

    def grow(self, gpu_budget: int, cpu_budget: int) -> dict[str, tuple[int, int]]:
        """Larger tier budgets for adapters to come (AdapterTiers.grow); nothing moves until they are used."""
        return self.tiers.grow(gpu_budget, cpu_budget)

    def unload(self, name: str) -> None:
        """Forget an adapter and free its memory in whichever tier holds it."""
        self.tiers.remove(name)
        self._drop_device(name)
        self._host.pop(name, None)
        self._artifacts.pop(name, None)
        self._layouts.pop(name, None)

    def pin(self, name: str) -> None:
        self._apply(self.tiers.pin(name))

    def unpin(self, name: str) -> None:
        self.tiers.unpin(name)

    # -- serving ---------------------------------------------------------------------------------

    def acquire(self, names: Sequence[str | None]) -> list[int | None]:
        """Bring a batch's adapters (one name or None per row) onto the device; returns each row's slot."""
        self._apply(self.tiers.acquire(names))
        return [None if n is None else self._slot_of[n] for n in names]

    @contextmanager
    def serving(self, names: Sequence[str | None]) -> Iterator[list[int | None]]:
        """Forwards inside the block use, for row i, the adapter names[i] (None: the base model alone)."""
        slots = self.acquire(names)
        with self.slots.batch(slots):
            yield slots

    def hint(self, demand: Mapping[str, float]) -> list[str]:
        """Expected demand from the console; returns the names this pool does not hold."""
        return self.tiers.hint(demand)

    def prefetch(self) -> list[Move]:
        """Promote the most demanded adapters while the device tier has room for them; returns the moves made."""
        moves = self.tiers.prefetch()
        self._apply(moves)
        return moves

    def offload(self) -> None:
        """Free the device tier before the model sleeps (adapters go to the host tier or disk)."""
        self._apply(self.tiers.offload())

    def restore(self) -> None:
        """Bring pinned adapters back after the model woke; the rest return on their next request."""
        self._apply(self.tiers.restore())

    # -- stats -----------------------------------------------------------------------------------

    def stats_of(self, name: str) -> dict[str, Any]:
        state = self.tiers.adapters[name]
        row = asdict(state)
        row["slot"] = self._slot_of.get(name)
        row["path"] = str(self._artifacts[name].path)
        return row

    def stats(self) -> dict[str, Any]:
        """Per adapter (tier, requests, hits, misses, swap times) and pool totals, JSON-ready."""
        swaps = sorted(self.swap_seconds)
        totals = asdict(self.tiers.totals())
        totals["swap_ms_p50"] = _ms(swaps, 0.50)
        totals["swap_ms_p95"] = _ms(swaps, 0.95)
        self.tiers.scores()  # decay every score to now before reporting it
        return {"adapters": [self.stats_of(n) for n in self.tiers.adapters], "totals": totals}

    # -- carrying out moves ------------------------------------------------------------------------

    def _apply(self, moves: Iterable[Move]) -> None:
        for move in moves:
            try:
                self._carry_out(move)
            except BaseException:
                # Whatever copy was not made is not there: let the policy see the adapter on disk.
                if move.name not in self._host and move.name not in self._device:
                    self.tiers.lost(move.name)
                raise

    def _carry_out(self, move: Move) -> None:
        name = move.name
        if move.target == DISK:
            self._drop_device(name)
            self._host.pop(name, None)
        elif move.target == CPU:
            if move.source == GPU:
                self._host[name] = self._device[name].copy_to(torch.device("cpu"), pin=self._pin)
                self._drop_device(name)
            else:
                self._host[name] = self._read(name)
        elif move.target == GPU:
            began = time.perf_counter()
            host = self._host.pop(name) if move.source == CPU else self._read(name)
            packed = host.copy_to(self.device)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()  # a swap-in is done when the copy is
            self._device[name] = packed
            slot = min(set(range(len(self._slot_of) + 1)) - set(self._slot_of.values()))
            self.slots.put(slot, packed.weights())
            self._slot_of[name] = slot
            elapsed = time.perf_counter() - began
            self.tiers.record_swap(name, elapsed)
            self.swap_seconds.append(elapsed)

    def _read(self, name: str) -> PackedAdapter:
        return read_packed(self._artifacts[name], self._layouts[name], self.dtype, pin=self._pin)

    def _drop_device(self, name: str) -> None:
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self.slots.remove(slot)
        self._device.pop(name, None)


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 3)
