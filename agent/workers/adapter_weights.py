"""An adapter's A/B tensors packed into one flat buffer, so moving it between tiers is one copy (imports torch).

A 1B decoder with LoRA on 7 projections of 16 layers has 224 tensors per adapter; one host-to-device
copy of a packed buffer avoids paying a transfer's fixed cost 224 times per swap-in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from safetensors import safe_open

from agent.artifacts import ArtifactError
from agent.artifacts.adapters import WEIGHTS_NAME, AdapterArtifact, match_module
from agent.workers.lora import LoraWeights


@dataclass(frozen=True)
class PackedLayer:
    layer: str  # the multi-LoRA layer it feeds
    a_offset: int
    a_shape: tuple[int, int]
    b_offset: int
    b_shape: tuple[int, int]
    scale: float


@dataclass(frozen=True)
class PackedAdapter:
    flat: torch.Tensor  # 1-D, every A and B back to back, in the serving dtype
    layout: tuple[PackedLayer, ...]

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def weights(self) -> dict[str, LoraWeights]:
        """Views into the flat buffer, by layer name, as AdapterSlots.put takes them."""
        flat = self.flat
        return {p.layer: LoraWeights(_view(flat, p.a_offset, p.a_shape), _view(flat, p.b_offset, p.b_shape), p.scale)
                for p in self.layout}

    def copy_to(self, device: torch.device, *, pin: bool = False) -> PackedAdapter:
        """A copy on `device` (pinned host memory when `pin`, so a later host-to-GPU copy can run async)."""
        if device.type == "cpu":
            flat = torch.empty(self.flat.shape, dtype=self.flat.dtype, pin_memory=pin)
            flat.copy_(self.flat)
        else:
            flat = self.flat.to(device, non_blocking=self.flat.is_pinned())
        return PackedAdapter(flat, self.layout)


def plan_layout(artifact: AdapterArtifact, layers: dict[str, tuple[int, int]]) -> tuple[PackedLayer, ...]:
    """Where each module's A and B go in the flat buffer; refuses modules the model has no fitting layer for.

    `layers` maps the model's multi-LoRA layer names to their (in_features, out_features).
    """
    layout, offset = [], 0
    for m in artifact.modules:
        layer = match_module(m.name, layers)
        if layer is None:
            raise ArtifactError(
                f"{artifact.path}: adapter targets {m.name}, which this worker did not wrap for LoRA "
                "(attach_multi_lora targets)"
            )
        if layers[layer] != (m.in_features, m.out_features):
            in_f, out_f = layers[layer]
            raise ArtifactError(
                f"{artifact.path}: adapter targets {m.name} with in={m.in_features}, out={m.out_features}; "
                f"the model's layer {layer} has in={in_f}, out={out_f}"
            )
        a_shape, b_shape = (m.rank, m.in_features), (m.out_features, m.rank)
        layout.append(PackedLayer(layer, offset, a_shape, offset + math.prod(a_shape), b_shape, m.scale))
        offset += math.prod(a_shape) + math.prod(b_shape)
    return tuple(layout)


def read_packed(
    artifact: AdapterArtifact, layout: Iterable[PackedLayer], dtype: torch.dtype, *, pin: bool = False
) -> PackedAdapter:
    """Read the adapter's safetensors file into one host buffer of `dtype` laid out as `layout`."""
    layout = tuple(layout)
    total = sum(math.prod(p.a_shape) + math.prod(p.b_shape) for p in layout)
    flat = torch.empty(total, dtype=dtype, pin_memory=pin)
    path = artifact.path / WEIGHTS_NAME
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for m, p in zip(artifact.modules, layout, strict=True):
            _view(flat, p.a_offset, p.a_shape).copy_(f.get_tensor(m.a_key))
            _view(flat, p.b_offset, p.b_shape).copy_(f.get_tensor(m.b_key))
    return PackedAdapter(flat, layout)


def _view(flat: torch.Tensor, offset: int, shape: tuple[int, int]) -> torch.Tensor:
    return flat[offset : offset + math.prod(shape)].view(shape)
