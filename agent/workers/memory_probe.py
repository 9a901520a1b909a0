"""Measure what a model holds and what one forward pass adds on the CPU (imports torch: workers and bench).

The forward peak is glibc's malloc in-use bytes (mallinfo2: uordblks + hblkhd, all arenas, mmapped
chunks included; torch's CPU allocator uses malloc) sampled after every aten op through a
TorchDispatchMode, minus the value before the forward. Not tracemalloc (it does not see torch's
allocations) and not RSS (it does not shrink when the allocator frees). bench/estimate_accuracy.py
and the worker measure the same way, with this module.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def _load_mallinfo2() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        function = libc.mallinfo2  # glibc 2.33 and later
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_mallinfo2 = _load_mallinfo2()


def malloc_available() -> bool:
    """Whether malloc's in-use bytes can be read here (glibc 2.33+)."""
    return _mallinfo2 is not None


def malloc_in_use() -> int:
    """Bytes malloc has handed out and not taken back, all arenas and mmapped chunks; 0 without glibc."""
    if _mallinfo2 is None:
        return 0
    info = _mallinfo2()
    return int(info.uordblks + info.hblkhd)


class PeakMalloc(TorchDispatchMode):
    """Samples malloc's in-use bytes after every aten op: a forward's peak at op granularity."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = malloc_in_use()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, malloc_in_use())
        return out


def forward_peak_bytes(forward: Callable[[], Any]) -> int:
    """Bytes one call of `forward` adds at its peak over what was in use before it (CPU, malloc)."""
    gc.collect()
    before = malloc_in_use()
    with PeakMalloc() as tracker:
        out = forward()
    peak = tracker.peak - before
    del out
    return max(peak, 0)


def unique_tensors(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Every parameter and buffer, each storage once (tied weights are one storage)."""
    seen: set[tuple[str, int]] = set()
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        yield tensor


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters and buffers, shared storages counted once (what stays resident)."""
    return sum(t.untyped_storage().nbytes() for t in unique_tensors(model))


def checkpoint_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(unique state_dict tensor bytes, non-persistent buffer bytes): what a checkpoint holds, and the rest."""
    seen, total = set(), 0
    state = model.state_dict()
    for t in state.values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    extra = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n not in state)
    return total, extra
