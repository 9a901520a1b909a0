from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Field, Schema
from pydantic import ConfigDict

from console.catalog.memory import MAX_BATCH, MAX_SEQ
from console.catalog.names import MAX_NAME, NAME_PATTERN

MAX_PATH = 1000  # the path columns


class RequestBody(Schema):
    """A request body: a field the API does not know is refused (a typo is not silently ignored), and a value of
    another JSON type than the schema says is refused, not coerced ("yes", 1 or "true" for a boolean, "3" or 2.0
    for an integer); a JSON integer is still a number. Query and path parameters arrive as text and stay lax."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def name_field(what: str):
    # The pattern is documented, not enforced here: the services refuse a bad name in plainer words.
    return Field(json_schema_extra={"pattern": NAME_PATTERN}, max_length=MAX_NAME,
                 description=f"the {what}'s name: 1-63 lowercase letters, digits, '.', '_' or '-', starting and "
                 "ending with a letter or digit; deployments and adapters share one namespace")


TEAM_FIELD = ("the team that owns it: one you are a member of (admins: any); needed only when you are in several "
              "teams")


class ModelIn(RequestBody):
    name: str = name_field("model")
    path: str = Field(max_length=MAX_PATH, description="the model directory: absolute, or relative to the first "
                      "model root (MODELGRID_MODEL_ROOTS); it must resolve inside a model root")
    team: str | None = Field(None, max_length=63, description=TEAM_FIELD)


class ModelPatch(RequestBody):
    path: str | None = Field(None, max_length=MAX_PATH, description="a new model directory, or the same one to read "
                             "its files again; a changed artifact gets a new estimate and its deployments' replicas "
                             "restart onto it one at a time, drained. The name and the figures read from the files "
                             "cannot be changed")


class ModelOut(Schema):
    name: str
    team: str = Field(alias="team.name", description="the team that owns it")
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


class ErrorItem(Schema):
    loc: list[str | int] = Field(description="where: [\"body\", field], [\"query\", name], or [] for the request "
                                 "as a whole")
    msg: str
    type: str = Field(description="a short code: invalid, not_found, conflict, unauthorized, forbidden, "
                      "server_error, or pydantic's error type")


class ErrorOut(Schema):
    """Every refusal of the API, whatever its status: one or more items."""

    detail: list[ErrorItem]


class EstimateIn(RequestBody):
    path: str | None = Field(None, max_length=MAX_PATH, description="a model directory, config-only directory, "
                             "config.json or .safetensors file inside the model roots (MODELGRID_MODEL_ROOTS)")
    model: str | None = Field(None, max_length=63, description="or a registered model's name")
    dtype: str | None = Field(None, max_length=20, description="serving dtype (torch name or fp32/fp16/bf16); "
                              "default: as stored")
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="concurrent sequences")
    seq: int | None = Field(None, ge=1, le=MAX_SEQ, description="tokens per sequence (image side for vision models)")
    device: Literal["cuda", "cpu"] = "cuda"
    adapter_pool_bytes: int = Field(0, ge=0, le=2**62, description="device-tier budget for LoRA adapters")


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


class AdapterIn(RequestBody):
    name: str = name_field("adapter")
    deployment: str = Field(max_length=63, description="the deployment whose base-model replicas serve it")
    path: str = Field(max_length=MAX_PATH, description="a PEFT LoRA directory (adapter_config.json + "
                      "adapter_model.safetensors) inside the model roots")
    pinned: bool = Field(False, description="keep it in the device tier, never evicted")


class AdapterPatch(RequestBody):
    path: str | None = Field(None, max_length=MAX_PATH, description="a new PEFT LoRA directory, or the same one to "
                             "read its files again (checked against the base model as registration checks it); a "
                             "changed adapter restarts its deployment's replicas onto it one at a time, drained")
    pinned: bool | None = Field(None, description="keep it in the device tier, never evicted (no restart)")


class AdapterOut(Schema):
    name: str
    deployment: str = Field(alias="deployment.name")
    team: str = Field(alias="team.name", description="the team that owns it: its deployment's")
    path: str
    rank: int
    modules: int
    parameters: int
    nbytes: int
    pinned: bool
    created: datetime
