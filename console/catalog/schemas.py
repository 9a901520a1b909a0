from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Field, Schema


class ModelIn(Schema):
    name: str
    path: str


class ModelOut(Schema):
    name: str
    path: str
    architecture: str
    model_type: str
    task: str
    stored_dtype: str
    parameters: int
    weights_bytes: int
    estimate_bytes: int
    estimate: dict
    created: datetime


class ErrorOut(Schema):
    detail: str


class EstimateIn(Schema):
    path: str | None = Field(None, description="a model directory, config-only directory, config.json or .safetensors "
                             "file on the console host")
    model: str | None = Field(None, description="or a registered model's name")
    dtype: str | None = Field(None, description="serving dtype (torch name or fp32/fp16/bf16); default: as stored")
    batch: int = Field(1, description="concurrent sequences")
    seq: int | None = Field(None, description="tokens per sequence (image side for vision models)")
    device: Literal["cuda", "cpu"] = "cuda"
    adapter_pool_bytes: int = Field(0, ge=0, description="device-tier budget for LoRA adapters")


class EstimateOut(Schema):
    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    adapter_pool_bytes: int
    overhead_bytes: int
    total_bytes: int = Field(description="the estimator's total, before calibration")
    parameters: int
    architecture: str
    family: str
    dtype: str
    batch: int
    seq: int
    device: str
    notes: list[str]
    calibrated_bytes: int = Field(description="total after the family's correction from measured loads")
    calibration_factor: float
    calibrated_from: int = Field(description="measured loads behind the correction (0: uncalibrated)")


class AdapterIn(Schema):
    name: str
    deployment: str = Field(description="the deployment whose base-model replicas serve it")
    path: str = Field(description="a PEFT LoRA directory: adapter_config.json + adapter_model.safetensors")
    pinned: bool = Field(False, description="keep it in the device tier, never evicted")


class AdapterOut(Schema):
    name: str
    deployment: str = Field(alias="deployment.name")
    path: str
    rank: int
    modules: int
    parameters: int
    nbytes: int
    pinned: bool
    created: datetime
