from __future__ import annotations

from datetime import datetime

from ninja import Field, Schema


class DeploymentIn(Schema):
    name: str
    model: str
    replicas: int = Field(1, ge=0, le=64)
    priority: str = "standard"
    dtype: str | None = Field(None, description="serving dtype (float32, float16, bfloat16 or fp32/fp16/bf16); "
                              "default: as stored")
    batch: int = Field(1, ge=1, description="concurrent sequences per replica, for the memory estimate")
    seq: int | None = Field(None, ge=1, description="tokens per sequence; default min(max positions, 2048)")


class DeploymentPatch(Schema):
    replicas: int = Field(..., ge=0, le=64)


class MemoryOut(Schema):
    estimated_bytes: int | None = Field(description="what the replica reserves: the estimate after calibration")
    uncalibrated_bytes: int | None = Field(description="the estimator's total before calibration")
    calibrated_from: int = Field(description="loads of this architecture family and device kind behind the correction")
    measured_bytes: int | None
    error_percent: float | None = Field(description="(estimated - measured) / measured, in percent")
    device: str | None = None


class ReplicaOut(Schema):
    index: int
    host: str | None
    gpus: list[int]
    state: str
    desired_state: str
    reserved_bytes: int
    measured_bytes: int | None
    memory: MemoryOut
    endpoint: str | None
    pid: int | None
    reason: str


class DeploymentAdapterOut(Schema):
    name: str
    path: str
    rank: int
    nbytes: int
    pinned: bool


class DeploymentOut(Schema):
    name: str
    model: str
    replica_count: int
    priority: str
    dtype: str
    batch: int
    seq: int | None
    estimates: dict = Field(description="the estimator's breakdown per device kind (cpu, cuda), before calibration")
    adapters: list[DeploymentAdapterOut]
    state: str
    reason: str
    created: datetime
    replicas: list[ReplicaOut]
