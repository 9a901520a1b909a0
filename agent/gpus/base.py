"""The interface every GPU backend implements: NVML for real devices, simulated for GPU-less hosts."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from agent.protocol import GpuInfo

DeviceKind = Literal["cuda", "cpu"]


@runtime_checkable
class GpuBackend(Protocol):
    """Reports the GPUs of this host; `device_kind` is where workers run their models."""

    device_kind: DeviceKind

    def is_available(self) -> bool:
        """Whether this backend can report GPUs on this host."""
        ...

    def collect(self, used_by_workers: dict[int, int]) -> list[GpuInfo]:
        """One reading of every GPU; `used_by_workers` maps GPU index to bytes our workers measured."""
        ...

    def process_memory(self, pid: int) -> int | None:
        """Device memory held by one process, CUDA context included; None where it cannot be read."""
        ...


class GpuBackendUnavailable(RuntimeError):
    """The backend cannot run on this host; the message says why and what to do instead."""
