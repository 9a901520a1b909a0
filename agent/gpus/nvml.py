"""Real NVIDIA GPUs through NVML. The only module that imports pynvml (from the nvidia-ml-py package).

NVML is initialised lazily and once; on a host without the library or driver every query degrades
to "not available" with the reason NVML gave, instead of failing the agent.
"""

from __future__ import annotations

import logging
from typing import Any

from agent.protocol import GpuInfo

log = logging.getLogger(__name__)


class NvmlBackend:
    """GPUs as NVML sees them; memory used is NVML's reading, which includes foreign processes."""

    device_kind = "cuda"

    def __init__(self) -> None:
        self._nvml: Any = None
        self._initialised: bool | None = None  # None: not tried yet
        self.unavailable_reason = ""

    def _init(self) -> bool:
        # Idempotent: the outcome of the first attempt is kept, so a missing driver costs one call.
        if self._initialised is not None:
            return self._initialised
        try:
            import pynvml
        except ImportError:
            self._initialised = False
            self.unavailable_reason = "the nvidia-ml-py package is not installed"
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self._initialised = False
            self.unavailable_reason = f"NVML is not available: {e}"
            return False
        self._nvml = pynvml
        self._initialised = True
        return True

    def is_available(self) -> bool:
        """True when NVML initialised and sees at least one GPU."""
        if not self._init():
            return False
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as e:
            self.unavailable_reason = f"NVML cannot count GPUs ({e})"
            return False
        if count == 0:
            self.unavailable_reason = "NVML sees no GPUs on this host"
        return count > 0

    def collect(self, used_by_workers: dict[int, int]) -> list[GpuInfo]:
        """Read every GPU; `used_by_workers` is ignored because NVML measures real usage."""
        if not self._init():
            return []
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            log.warning("NVML cannot count GPUs: %s", e)
            return []
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._read(index))
            except nvml.NVMLError as e:
                # One broken GPU must not hide the others.
                log.warning("NVML cannot read GPU %d: %s", index, e)
        return gpus

    def process_memory(self, pid: int) -> int | None:
        """GPU memory NVML charges to process `pid` on all GPUs (CUDA context included); None if unknown.

        None when NVML is missing, sees no such process (another PID namespace, such as a container
        without --pid=host), or cannot say (MPS clients and some drivers report no per-process use).
        """
        if not self._init():
            return None
        nvml = self._nvml
        total, seen = 0, False
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError:
            return None
        for index in range(count):
            try:
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(index))
            except nvml.NVMLError as e:
                log.debug("NVML cannot list the processes of GPU %d: %s", index, e)
                continue
            for process in processes:
                used = getattr(process, "usedGpuMemory", None)
                if process.pid == pid and used is not None:
                    total, seen = total + int(used), True
        return total if seen else None

    def _read(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: float | None = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:
            utilization = None  # not supported on some devices (MIG instances, vGPU)
        return GpuInfo(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            utilization=utilization,
            simulated=False,
        )


def _text(value: str | bytes) -> str:
    # Older NVML bindings return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value
