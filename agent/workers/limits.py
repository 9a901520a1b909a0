"""Hold a worker to its share of the device, and recognise running out of memory (worker side).

`before_cuda` runs before anything touches CUDA (a warm spare has imported torch but not
initialised CUDA, so it can still take any MPS share). `apply_memory_limits` runs just before the
load: on CUDA the reservation becomes torch's per-process memory fraction; on the CPU an optional
address-space cap (RLIMIT_AS) above the worker's baseline makes allocations past it fail, the CPU
analogue of the fraction (used to exercise out-of-memory handling without a GPU).
"""

from __future__ import annotations

import os
import resource
from typing import Any

from agent.workers.spec import WorkerSpec

MPS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# Allocation failures that are not typed as such: torch's CPU allocator raises RuntimeError, and
# libraries that wrap it (safetensors, transformers' loading threads) keep the message.
# Under an address-space cap, a lazy import that cannot map its library or a thread that cannot map its
# stack is the same shortage.
_OOM_TEXTS = ("can't allocate memory", "out of memory", "cannot allocate memory", "failed to map segment",
              "can't start new thread")


def before_cuda(spec: WorkerSpec) -> None:
    """Environment CUDA reads when it initialises: the MPS active-thread percentage."""
    if spec.mps_percentage is not None:
        os.environ[MPS_ENV] = str(int(spec.mps_percentage))


def apply_memory_limits(spec: WorkerSpec, torch: Any, device: Any) -> str:
    """Apply the spec's limits; returns a line for the log ("" when there is none)."""
    if device.type == "cuda" and spec.reserved_bytes and spec.gpu_total_bytes:
        fraction = min(1.0, spec.reserved_bytes / spec.gpu_total_bytes)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        return f"memory fraction {fraction:.4f} of {spec.gpu_total_bytes} bytes ({spec.reserved_bytes} reserved)"
    if device.type == "cpu" and spec.memory_limit_bytes:
        baseline = _address_space()
        cap = baseline + int(spec.memory_limit_bytes)
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        return f"address space capped at {cap} bytes ({spec.memory_limit_bytes} above the baseline {baseline})"
    return ""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether an exception means an allocation failed (CUDA or host), as opposed to a bug or bad input."""
    if isinstance(error, MemoryError):
        return True
    if type(error).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
        return True
    text = str(error).lower()
    return any(t in text for t in _OOM_TEXTS)


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE")
