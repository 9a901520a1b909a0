from __future__ import annotations

from datetime import datetime

from ninja import Field, Schema


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
    state: str = Field(description="connected; unknown: its lease lapsed or its link closed, so it keeps its "
                       "replicas but gets no new ones; offline: evicted, its replicas were re-placed")
    unknown_since: datetime | None = Field(description="when its lease lapsed or its link closed")
    evicted_at: datetime | None = Field(description="when its replicas were released for re-placement")
    last_seen: datetime | None
    agent_version: str
    generation: int
    acked_generation: int
    labels: dict[str, str] = Field(description="labels of all its GPUs (set with PATCH), e.g. zone=east")
    taints: dict[str, str] = Field(description="only deployments that tolerate each of these are placed here")
    engines: dict[str, str] = Field(description="the engines its agent runs replicas with, name -> version (each a "
                                    "label of its GPUs: engine.NAME=yes)")
    gpus: list[GpuOut]
