"""Hold a worker to its share of the device, and recognise running out of memory (worker side).

`before_cuda` runs before anything touches CUDA (a warm spare has imported torch but not
initialised CUDA, so it can still take any MPS share) and, in a cold worker, before torch is imported.
`apply_memory_limits` runs just before the load: on CUDA the reservation becomes torch's per-process
memory fraction; on the CPU an address-space cap (RLIMIT_AS) above the worker's baseline makes
allocations past it fail, the CPU analogue of the fraction, so one request too big for its replica
fails alone instead of taking the host's memory. When the console grows a running replica's reservation
(its adapter pool grew), `grow_memory_limits` raises either by as much.

CPU workers also get their share of the host's cores (`spec.threads`): torch would otherwise start
one intra-op thread per core in every worker, and several workers on the same cores then spend their
time in OpenMP barriers instead of computing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
from typing import Any

from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.worker")

MPS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # read once, when torch's thread pools start
# glibc gives each thread that allocates its own malloc arena, reserving 64 MiB of address space per
# arena (up to 8 per core): under an address-space cap that reservation, not memory, would run out.
# Two arenas (the main one and one for every other thread) keep a capped worker's reservations bounded.
M_ARENA_MAX = -8
CAPPED_ARENAS = 2
_PARALLEL_ELEMENTS = 1 << 16  # per thread: above torch's grain size (32768), so an elementwise op runs on all
# Allocation failures that are not typed as such: torch's CPU allocator raises RuntimeError, and
# libraries that wrap it (safetensors, transformers' loading threads) keep the message.
# Under an address-space cap, a lazy import that cannot map its library or a thread that cannot map its
# stack is the same shortage.
_OOM_TEXTS = ("can't allocate memory", "out of memory", "cannot allocate memory", "failed to map segment",
              "can't start new thread")


def before_cuda(spec: WorkerSpec) -> None:
    """What must be in place before CUDA initialises and before torch's thread pools start: the MPS
    active-thread percentage, the thread count, and (capped workers) the malloc arena limit."""
    if spec.mps_percentage is not None:
        os.environ[MPS_ENV] = str(int(spec.mps_percentage))
    if spec.threads:
        for name in THREAD_ENVS:
            os.environ[name] = str(int(spec.threads))
    if spec.memory_limit_bytes:
        limit_malloc_arenas()


def apply_memory_limits(spec: WorkerSpec, torch: Any, device: Any) -> str:
    """Apply the spec's limits and thread count; returns a line for the log ("" when there is none)."""
    applied = []
    if device.type == "cpu" and spec.threads:
        applied.append(apply_threads(torch, int(spec.threads)))
    if device.type == "cuda" and spec.reserved_bytes and spec.gpu_total_bytes:
        fraction = min(1.0, spec.reserved_bytes / spec.gpu_total_bytes)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        total, reserved = spec.gpu_total_bytes, spec.reserved_bytes
        applied.append(f"memory fraction {fraction:.4f} of {total} bytes ({reserved} reserved)")
    if device.type == "cpu" and spec.memory_limit_bytes:
        limit_malloc_arenas()  # again: a no-op when before_cuda did it, and tests call this alone
        baseline = _address_space()
        cap = baseline + int(spec.memory_limit_bytes)
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        applied.append(f"address space capped at {cap} bytes ({spec.memory_limit_bytes} above the baseline {baseline})")
    return "; ".join(applied)


def grow_memory_limits(spec: WorkerSpec, torch: Any, device: Any, current: int, reserved: int) -> str:
    """Raise the limits apply_memory_limits set from a reservation of `current` bytes to one of `reserved` (the
    console grew it in place: the replica's adapter pool grew); returns a line for the log ("" when nothing
    changed). Never lowered: the scheduler does not shrink a running replica's reservation."""
    grown = reserved - current
    if grown <= 0 or not current:  # 0: no limit was set, none is set now
        return ""
    if device.type == "cuda" and spec.gpu_total_bytes:
        fraction = min(1.0, reserved / spec.gpu_total_bytes)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        return f"memory fraction raised to {fraction:.4f} of {spec.gpu_total_bytes} bytes ({reserved} reserved)"
    if device.type == "cpu" and spec.memory_limit_bytes:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return ""
        cap = soft + grown if hard == resource.RLIM_INFINITY else min(soft + grown, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        return f"address space cap raised to {cap} bytes ({grown} more reserved)"
    return ""


def apply_threads(torch: Any, threads: int) -> str:
    """Run torch's CPU work on `threads` intra-op threads and one inter-op thread; returns the log line."""
    torch.set_num_threads(threads)
    # The inter-op pool can be sized only before it starts (RuntimeError afterwards): a warm spare or an
    # earlier load may have started it. Then it keeps its size; inference here does not use it.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    # Start the main thread's OpenMP pool now, before any address-space cap: its threads' stacks then count
    # in the worker's baseline, and libgomp, which exits the process when it cannot create a thread, never
    # has to create one for a request under the cap (the first parallel region of a big request would).
    torch.zeros(threads * _PARALLEL_ELEMENTS).add_(1)
    return f"torch threads: {torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op"


def limit_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas (see CAPPED_ARENAS); False where there is no glibc mallopt."""
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_ARENA_MAX, CAPPED_ARENAS))
    except (OSError, AttributeError):  # not glibc (musl, macOS): no per-thread arenas to cap there
        log.debug("mallopt is not available: malloc arenas are left as they are")
        return False


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
