"""Pure placement core: frozen dataclasses in, a plan out, a reason for every decision.

No Django, no ORM, no I/O: the console snapshots its rows into these types.
"""

from console.scheduler.plan import plan
from console.scheduler.types import GpuSlot, Placement, Plan, ReplicaRequest, Unplaced

__all__ = ["GpuSlot", "Placement", "Plan", "ReplicaRequest", "Unplaced", "plan"]
