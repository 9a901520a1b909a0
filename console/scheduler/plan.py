"""Best-fit decreasing over a reservation ledger.

Largest replicas first, each onto the GPU whose free space fits it most tightly, so large
replicas still find room and small ones fill the gaps. Existing reservations are never moved.
"""

from __future__ import annotations

from collections.abc import Iterable

from console.scheduler.types import GpuSlot, Placement, Plan, ReplicaRequest, Unplaced

GiB = 1024**3


def gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def free_bytes(gpu: GpuSlot, buffer_bytes: int) -> int:
    """What may still be reserved: total minus foreign use, reservations and the safety buffer."""
    return gpu.total_bytes - gpu.foreign_bytes - gpu.reserved_bytes - buffer_bytes


def plan(gpus: Iterable[GpuSlot], requests: Iterable[ReplicaRequest], buffer_bytes: int = 0) -> Plan:
    """Place `requests` on `gpus` without ever overcommitting; explain every outcome."""
    free = {g.id: free_bytes(g, buffer_bytes) for g in gpus}
    placements: list[Placement] = []
    unplaced: list[Unplaced] = []
    ordered = sorted(requests, key=lambda r: (-r.bytes, r.deployment, r.index))
    for req in ordered:
        fitting = [(space, gpu_id) for gpu_id, space in free.items() if space >= req.bytes]
        if not fitting:
            unplaced.append(Unplaced(req.deployment, req.index, _refusal(req, free)))
            continue
        space, gpu_id = min(fitting)
        free[gpu_id] = space - req.bytes
        placements.append(
            Placement(
                req.deployment,
                req.index,
                gpu_id,
                f"best fit: needs {gib(req.bytes)}; {gpu_id} had {gib(space)} free, "
                f"{gib(space - req.bytes)} left after",
            )
        )
    return Plan(tuple(placements), tuple(unplaced))


def _refusal(req: ReplicaRequest, free: dict[str, int]) -> str:
    if not free:
        return f"needs {gib(req.bytes)}; no GPU is available (no agent connected)"
    space, gpu_id = max((s, g) for g, s in free.items())
    return f"needs {gib(req.bytes)}; the largest free space is {gib(max(space, 0))} on {gpu_id}"
