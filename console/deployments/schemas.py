from __future__ import annotations

from datetime import datetime

from ninja import Field, Schema


class DeploymentIn(Schema):
    name: str
    model: str
    replicas: int = Field(1, ge=0, le=64)
    priority: str = "standard"


class DeploymentPatch(Schema):
    replicas: int = Field(..., ge=0, le=64)


class ReplicaOut(Schema):
    index: int
    host: str | None
    gpus: list[int]
    state: str
    desired_state: str
    reserved_bytes: int
    measured_bytes: int | None
    endpoint: str | None
    pid: int | None
    reason: str


class DeploymentOut(Schema):
    name: str
    model: str
    replica_count: int
    priority: str
    state: str
    reason: str
    created: datetime
    replicas: list[ReplicaOut]
