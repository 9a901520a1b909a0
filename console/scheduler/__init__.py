"""Pure placement and priority core: frozen dataclasses in, a plan out, a reason for every decision.

No Django, no ORM, no I/O: the console snapshots its rows into these types and calls `plan`.
"""

from console.scheduler.planner import plan
from console.scheduler.types import (
    STRATEGIES,
    TIERS,
    DemandOutcome,
    Deployment,
    Gpu,
    GpuBalance,
    Host,
    Move,
    Plan,
    PlanInput,
    PlannedReplica,
    Replica,
    ScaleDecision,
    SearchReport,
    Settings,
    Unplaced,
)

__all__ = [
    "STRATEGIES",
    "TIERS",
    "Deployment",
    "DemandOutcome",
    "Gpu",
    "GpuBalance",
    "Host",
    "Move",
    "Plan",
    "PlanInput",
    "PlannedReplica",
    "Replica",
    "ScaleDecision",
    "SearchReport",
    "Settings",
    "Unplaced",
    "plan",
]
