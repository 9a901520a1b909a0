"""A deployment's policy, declared once: every field an operator may set, its bounds and the rules
between fields. The REST schemas derive from `Policy`; the services, the SLO form and the Django admin all
validate through `validate_policy`, and its refusals carry the field they are about."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator
from pydantic import ValidationError as PydanticError

import agent.engines as engines
from agent.artifacts import ArtifactError
from agent.artifacts.roots import resolve_in_roots
from agent.protocol.engine_args import MAX_ENGINE_ARGS, EngineArgsError
from console.errors import Invalid, describe, pydantic_items

MAX_REPLICAS = 64
ENGINE_CHOICE = Literal[tuple(value for value, _ in engines.choices())]  # auto, or an engine of agent.engines
MAX_GANG = 16
MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600
MAX_SLO_MS = 3_600_000
MAX_SELECTOR_LABELS = 16

# Printable: a label is shown on pages and stored as JSON text (PostgreSQL's jsonb refuses a NUL).
Label = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[^\x00-\x1f\x7f]+$")]
Count = Annotated[int, Field(ge=0, le=MAX_REPLICAS)]


class Policy(BaseModel):
    """What the operator decides about a deployment. Field order matters: each range rule reads the
    fields declared before it."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    min_replicas: Count = Field(1, description="the scheduler never goes below this many replicas")
    max_replicas: Count = Field(1, description="nor above this many (it adds replicas while the SLO is violated)")
    replicas: Count = Field(1, description="the current count, within [min_replicas, max_replicas]; given alone it "
                            "sets a fixed count (min = max = replicas)")
    gpus_per_replica: int = Field(1, ge=1, le=MAX_GANG, description="GPUs one replica spans (a gang on one host)")
    priority: Literal["critical", "high", "standard", "batch"] = "standard"
    selector: dict[Label, Label] = Field(default_factory=dict, max_length=MAX_SELECTOR_LABELS,
                                         description="GPU labels required, e.g. {\"gpu\": \"h100\"}")
    tolerations: dict[Label, Label] = Field(default_factory=dict, max_length=MAX_SELECTOR_LABELS,
                                            description="host taints it may be placed on, e.g. {\"pool\": \"ml\"}; "
                                            "\"*\" tolerates every value of a taint")
    spread: Literal["preferred", "required", "none"] = Field(
        "preferred", description="its replicas on different GPUs, then hosts, then zones: preferred (unless they "
        "cannot, and the reason says so), required (never two on one GPU) or none (as the strategy places them)")
    slo_latency_ms: int | None = Field(None, ge=1, le=MAX_SLO_MS,
                                       description="p95 latency target in ms; null: no SLO (0 is refused)")
    latency_critical: bool = False
    profile: Literal["", "compute", "memory", "io"] = Field("", description="what bounds it: compute, memory, io, "
                                                            "or empty (unknown)")
    max_batch_size: int = Field(8, ge=1, le=1024, description="dynamic batching: rows per forward")
    max_batch_delay_ms: float = Field(5.0, ge=0, le=10_000,
                                      description="dynamic batching: how long a request waits for others")
    standby: bool = Field(False, description="load its replicas but take no requests; turning it off serves "
                          "without a load gap")
    engine: ENGINE_CHOICE = Field(engines.AUTO, description=f"what runs its replicas: an engine (placed only on hosts "
                                  f"that run it), or {engines.AUTO_LABEL}; docs/engines.md")
    engine_args: list[str] = Field(default_factory=list, max_length=MAX_ENGINE_ARGS,
                                   description="flags for its engine that tune how it serves this deployment, e.g. "
                                   "[\"--enable-auto-tool-choice\", \"--tool-call-parser\", \"hermes\"] "
                                   "(docs/engines.md lists those each engine takes); a change restarts its replicas "
                                   "whose engine takes them at start")
    idle_timeout_s: int = Field(300, ge=1, le=MAX_IDLE_TIMEOUT_S,
                                description="scale to zero: with min_replicas 0, its replicas leave their GPUs after "
                                "this many seconds without requests; the next request brings one back")

    @field_validator("engine_args")
    @classmethod
    def _engine_args_taken(cls, args: list[str], info: ValidationInfo) -> list[str]:
        try:
            taken = engines.parse_settings(info.data.get("engine", engines.AUTO), args,
                                           gpus=info.data.get("gpus_per_replica"))
            for flag, path in taken.paths:  # a directory vLLM reads: inside the model roots, as a model's own
                try:
                    resolve_in_roots(path, settings.MODEL_ROOTS, kind="dir")
                except ArtifactError as e:
                    raise EngineArgsError(f"engine argument {flag!r}: {e}") from None
        except EngineArgsError as e:
            raise ValueError(str(e)) from None
        return args

    @field_validator("max_replicas")
    @classmethod
    def _max_not_below_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min_replicas")
        if low is not None and value < low:
            raise ValueError(f"max_replicas {value} is below min_replicas {low}")
        return value

    @field_validator("replicas")
    @classmethod
    def _replicas_in_range(cls, value: int, info: ValidationInfo) -> int:
        low, high = info.data.get("min_replicas"), info.data.get("max_replicas")
        if low is not None and high is not None and not low <= value <= high:
            raise ValueError(f"replicas {value} is outside [min_replicas {low}, max_replicas {high}]")
        return value


FIELDS: tuple[str, ...] = tuple(Policy.model_fields)
REPLICA_FIELDS = ("replicas", "min_replicas", "max_replicas")


def merged(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` on top of the stored `current` policy, the way an operator means them: `replicas` alone sets
    a fixed count (min = max = replicas); a new range alone keeps the current count inside it (the scheduler
    moves it within the range by SLO); a range and a count together are taken as given."""
    out = current | changes
    given = {f for f in REPLICA_FIELDS if f in changes}
    if given == {"replicas"} and isinstance(changes["replicas"], int):
        out["min_replicas"] = out["max_replicas"] = changes["replicas"]
    elif given and "replicas" not in given:
        low, high = out["min_replicas"], out["max_replicas"]
        if isinstance(low, int) and isinstance(high, int) and isinstance(out["replicas"], int):
            out["replicas"] = min(max(out["replicas"], low), high)
    return out


def creation_defaults(changes: dict[str, Any]) -> dict[str, Any]:
    """The policy a new deployment starts from: the defaults, with a maximum no lower than the minimum or
    count it was created with (creating with `min_replicas: 2` alone means a fixed 2)."""
    base = Policy().model_dump()
    if "max_replicas" not in changes:
        counts = [v for f in ("min_replicas", "replicas") if isinstance(v := changes.get(f), int)]
        base["max_replicas"] = max([base["max_replicas"], *counts]) if counts else base["max_replicas"]
        if "replicas" not in changes and isinstance(changes.get("min_replicas"), int):
            base["replicas"] = max(base["replicas"], changes["min_replicas"])
    return base


def validate_policy(values: dict[str, Any]) -> Policy:
    """The policy `values` describe, or Invalid carrying one error per field at fault."""
    try:
        return Policy.model_validate(values)
    except PydanticError as e:
        raise invalid_from(e) from None


def invalid_from(error: PydanticError, prefix: tuple[str, ...] = ("body",)) -> Invalid:
    """A pydantic refusal as the API's error items, with a message that names every field."""
    items = pydantic_items(error.errors(), prefix)
    return Invalid(describe(items), errors=items)
