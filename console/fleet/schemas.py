from __future__ import annotations

from datetime import datetime

from ninja import Schema


class GpuReplicaOut(Schema):
    deployment: str
    index: int
    state: str
    reserved_bytes: int
    measured_bytes: int | None


class GpuOut(Schema):
    index: int
    name: str
    uuid: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int
    utilization: float | None
    simulated: bool
    replicas: list[GpuReplicaOut]


class HostOut(Schema):
    name: str
    endpoint: str
    connected: bool
    last_seen: datetime | None
    agent_version: str
    generation: int
    acked_generation: int
    gpus: list[GpuOut]
