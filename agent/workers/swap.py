"""Sleep and wake: move a model's weights to host memory and back, bit for bit (imports torch: workers only).

`sleep` copies every parameter and buffer storage (each shared storage once) into one host buffer,
page-locked on CUDA so the copy back runs at full bus speed, then drops the device tensors so their
memory is freed (and handed back to the driver with empty_cache). The buffer is plain host memory
registered with cudaHostRegister at its exact size: `pin_memory=True` would round it up to a power
of two (torch's caching host allocator), up to twice the weights, and keep it cached after a wake.
`wake` allocates one device buffer, copies the host buffer into it in one transfer, and points
every parameter and buffer at its place in it, with the same dtype, shape, strides and sharing.

On the CPU, "device" and host are the same memory: sleep is still a real copy into a separate host
buffer and the model's own tensors are released, so the code path is the one that runs on CUDA,
but a sleeping CPU replica frees nothing; it holds the same bytes in its host buffer instead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

log = logging.getLogger("agent.worker")

ALIGN = 256  # bytes: every storage starts aligned in the one-block layout (CUDA kernels want >= 16)


@dataclass(frozen=True)
class Transfer:
    direction: str  # "sleep" or "wake"
    bytes: int
    seconds: float
    pinned: bool = False  # the host buffer was page-locked (CUDA)

    @property
    def bandwidth(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"direction": self.direction, "bytes": self.bytes, "seconds": self.seconds, "bandwidth": self.bandwidth,
                "pinned": self.pinned}


@dataclass(frozen=True)
class _Slot:
    """One registered tensor: module._parameters[name] or module._buffers[name]."""

    module: torch.nn.Module
    name: str
    is_parameter: bool
    tensor_id: int  # tensors registered in several places are restored as one tensor
    block: int  # index of its storage in the layout
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # storage offset, in elements


class WeightSwap:
    """Owns the sleep/wake of one model on one device; `asleep` says where the weights are."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.asleep = False
        self._slots: list[_Slot] = []
        self._offsets: list[int] = []  # byte offset of each storage in the host buffer
        self._sizes: list[int] = []
        self._host: torch.Tensor | None = None
        self._pinned = False
        self._release: torch.Tensor | None = None  # a page-locked buffer a wake no longer needs (release_host)

    @property
    def host_bytes(self) -> int:
        """Host memory held while asleep (0 when awake: a page-locked buffer a wake left for release_host() is
        freed within the wake's after_reply, so it is not counted against the host's sleep budget)."""
        return int(self._host.numel()) if self._host is not None else 0

    def sleep(self) -> Transfer:
        """Copy the weights to host memory and free them on the device."""
        if self.asleep:
            return Transfer("sleep", self.host_bytes, 0.0)
        self.release_host()  # for callers that skip after_reply (the worker never does)
        start = time.perf_counter()
        storages = self._layout()
        total = self._offsets[-1] + self._sizes[-1] if storages else 0
        host = torch.empty(total, dtype=torch.uint8)
        # Page-locked host memory: both copies are DMAs at full PCIe/NVLink bandwidth.
        pinned = self.device.type == "cuda" and total > 0 and pin(host)
        for storage, offset, size in zip(storages, self._offsets, self._sizes, strict=True):
            host[offset : offset + size].copy_(_bytes_of(storage), non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._host, self._pinned = host, pinned
        for slot in self._slots:  # drop every reference the model holds, so the storages are freed
            _assign(slot, torch.empty(0, dtype=slot.dtype, device=self.device))
        del storages
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.asleep = True
        return Transfer("sleep", total, time.perf_counter() - start, pinned)

    def wake(self) -> Transfer:
        """Copy the weights back onto the device in one transfer. A page-locked host copy is unlocked and freed by
        release_host(), which the caller must run once the wake is answered (the worker's after_reply)."""
        if not self.asleep or self._host is None:
            return Transfer("wake", 0, 0.0)
        start = time.perf_counter()
        host = self._host
        block = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
        block.copy_(host, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        storage = block.untyped_storage()
        restored: dict[int, torch.Tensor] = {}
        for slot in self._slots:
            tensor = restored.get(slot.tensor_id)
            if tensor is None:
                element = torch.empty(0, dtype=slot.dtype).element_size()
                base = self._offsets[slot.block] // element  # ALIGN is a multiple of every element size
                tensor = torch.empty(0, dtype=slot.dtype, device=self.device)
                tensor.set_(storage, base + slot.offset, slot.size, slot.stride)
                restored[slot.tensor_id] = tensor
            _assign(slot, tensor)
        pinned, self._pinned = self._pinned, False
        if pinned:
            # Unregistering the page-locked buffer took 37 ms of an 84 ms wake of 2 GiB on an H100: it waits for
            # release_host(), after the wake is answered (the worker's after_reply).
            self._release = host
        self._host = None
        self.asleep = False
        return Transfer("wake", int(host.numel()), time.perf_counter() - start, pinned)

    def release_host(self) -> None:
        """Unlock and free the host buffer a wake left page-locked (nothing to do otherwise)."""
        host, self._release = self._release, None
        if host is not None:
            unpin(host)  # before the buffer is freed

    def _layout(self) -> list[torch.UntypedStorage]:
        """Record every registered tensor and lay out its storage (each shared one once) in one block."""
        storages: list[torch.UntypedStorage] = []
        index: dict[int, int] = {}
        self._slots, self._offsets, self._sizes = [], [], []
        offset = 0
        for module in self.model.modules():
            for is_parameter, registry in ((True, module._parameters), (False, module._buffers)):
                for name, tensor in registry.items():
                    if tensor is None:
                        continue
                    storage = tensor.untyped_storage()
                    key = storage.data_ptr() if storage.nbytes() else -id(tensor)
                    if key not in index:
                        index[key] = len(storages)
                        storages.append(storage)
                        self._offsets.append(offset)
                        self._sizes.append(storage.nbytes())
                        offset += -(-storage.nbytes() // ALIGN) * ALIGN
                    self._slots.append(
                        _Slot(module, name, is_parameter, id(tensor), index[key], tensor.dtype,
                              tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())
                    )
        return storages


def pin(host: torch.Tensor) -> bool:
    """Page-lock a host tensor's memory in place, at its exact size; False (it stays pageable) if CUDA refuses."""
    cudart = torch.cuda.cudart()
    code = int(cudart.cudaHostRegister(host.data_ptr(), host.numel() * host.element_size(), 1))  # 1: portable
    if code != 0:
        clear = getattr(cudart, "cudaGetLastError", None)
        if clear is not None:
            clear()  # a failed registration must not surface later as another call's error
        return False
    return True


def unpin(host: torch.Tensor) -> None:
    cudart = torch.cuda.cudart()
    code = int(cudart.cudaHostUnregister(host.data_ptr()))
    if code != 0:
        # Outside any command now (after_reply): a failure left set would surface as the next kernel's error.
        clear = getattr(cudart, "cudaGetLastError", None)
        if clear is not None:
            clear()
        log.warning("cudaHostUnregister of a %d-byte host copy failed (CUDA error %d)", host.numel(), code)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _assign(slot: _Slot, tensor: torch.Tensor) -> None:
    if slot.is_parameter:
        # .data keeps the Parameter object, which tied modules share: one assignment reaches them all.
        slot.module._parameters[slot.name].data = tensor
    else:
        slot.module._buffers[slot.name] = tensor
