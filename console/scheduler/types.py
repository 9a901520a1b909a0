from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuSlot:
    """One schedulable GPU: its capacity and what is already committed on it."""

    id: str  # "host/index", stable across plans
    host: str
    total_bytes: int
    reserved_bytes: int = 0  # held by replicas already placed here
    foreign_bytes: int = 0  # used by processes ModelGrid does not own


@dataclass(frozen=True)
class ReplicaRequest:
    """A replica that needs a GPU."""

    deployment: str
    index: int
    bytes: int


@dataclass(frozen=True)
class Placement:
    deployment: str
    index: int
    gpu: str
    reason: str


@dataclass(frozen=True)
class Unplaced:
    deployment: str
    index: int
    reason: str


@dataclass(frozen=True)
class Plan:
    placements: tuple[Placement, ...] = field(default_factory=tuple)
    unplaced: tuple[Unplaced, ...] = field(default_factory=tuple)
