from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import create_model

from console.catalog.memory import MAX_BATCH, MAX_SEQ
from console.catalog.schemas import TEAM_FIELD, RequestBody, name_field
from console.deployments.policy import REPLICA_FIELDS, Policy
from console.pagination import ListQuery


def _policy_fields(defaults: bool) -> dict[str, Any]:
    """Policy's fields with their bounds, for a request schema: with `defaults` as Policy has them (except the
    replica counts, which follow each other), else all left out unless given."""
    out = {}
    for name, info in Policy.model_fields.items():
        keep = defaults and name not in REPLICA_FIELDS
        default = info.get_default(call_default_factory=True) if keep else None
        annotation = info.annotation if info.annotation is not None else Any
        if info.metadata:
            annotation = Annotated[annotation, *info.metadata]
        out[name] = (annotation, Field(default, description=info.description))
    return out


class _DeploymentSettings(RequestBody):
    name: str = name_field("deployment")
    model: str = Field(max_length=63, description="a registered model's name")
    dtype: str | None = Field(None, max_length=20, description="serving dtype (float32, float16, bfloat16 or "
                              "fp32/fp16/bf16); default: as stored")
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="concurrent sequences per replica, for the memory estimate")
    seq: int | None = Field(None, ge=1, le=MAX_SEQ, description="tokens per sequence, at most the model's positions; "
                            "default min(max positions, 2048)")


DeploymentIn = create_model(
    "DeploymentIn", __base__=_DeploymentSettings, __doc__="A new deployment: the serving settings and its policy. "
    "`replicas` alone is a fixed count; with min_replicas/max_replicas the scheduler keeps the count in the range.",
    team=(str | None, Field(None, max_length=63, description=TEAM_FIELD)),
    **_policy_fields(defaults=True),
)
DeploymentPatch = create_model(
    "DeploymentPatch", __base__=RequestBody, __doc__="Only the fields given change. `replicas` alone sets a fixed "
    "count (min = max); a range alone keeps the count inside it; `slo_latency_ms: null` removes the SLO.",
    **_policy_fields(defaults=False),
)


class MemoryOut(Schema):
    estimated_bytes: int | None = Field(description="what the replica reserves: the estimate after calibration")
    uncalibrated_bytes: int | None = Field(description="the estimator's total before calibration")
    calibrated_from: int = Field(description="loads of this architecture family and device kind behind the correction")
    measured_bytes: int | None
    error_percent: float | None = Field(description="(estimated - measured) / measured, in percent")
    device: str | None = None


class SleepWakeOut(Schema):
    direction: str = Field(description="sleep or wake")
    bytes: int
    seconds: float
    bandwidth: float | None = Field(None, description="bytes per second")


class AdapterStatOut(Schema):
    name: str
    tier: str = Field(description="where the replica holds it: gpu, cpu (host memory) or disk")
    pinned: bool = False
    nbytes: int
    requests: int = Field(0, description="rows that asked for it")
    hits: int = Field(0, description="batches that found it on the device")
    misses: int = Field(0, description="batches that had to swap it in")


class ReplicaOut(Schema):
    index: int
    host: str | None
    gpus: list[int]
    state: str
    desired_state: str
    reserved_bytes: int
    measured_bytes: int | None
    memory: MemoryOut
    action: str = Field(description="the scheduler's last decision: keep, place, move, wake, preempt, sleep, "
                        "stop or refuse")
    mps_percentage: int | None = Field(description="CUDA MPS active-thread percentage on a shared GPU")
    endpoint: str | None
    pid: int | None
    reason: str = Field(description="the scheduler's reason for its placement (written only by the scheduler)")
    observed_reason: str = Field(description="what its agent reported of it, e.g. why its worker failed "
                                 "(written only from the agent's reports)")
    loaded_bytes: int | None = Field(description="bytes read so far while loading")
    loading_total_bytes: int | None = Field(description="bytes to load in all")
    host_bytes: int | None = Field(description="host memory held while asleep")
    sleep_wake: SleepWakeOut | None = Field(description="the last sleep or wake")
    adapter_stats: list[AdapterStatOut]
    adapter_error: str = Field(description="why its worker refused an adapter, if it did")
    last_request_at: datetime | None = Field(description="when the gateway last had a request in flight on it")


class AdapterTierOut(Schema):
    replica: int
    tier: str


class DeploymentAdapterOut(Schema):
    name: str
    path: str
    rank: int
    nbytes: int
    pinned: bool
    tiers: list[AdapterTierOut] = Field(description="its tier on each replica that reported it")
    requests: int = Field(description="summed over the replicas")
    hits: int
    misses: int


class DeploymentOut(Schema):
    name: str
    model: str
    team: str = Field(description="the team that owns it")
    replica_count: int
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int
    selector: dict[str, str]
    tolerations: dict[str, str] = Field(description="host taints it may be placed on (\"*\": any value)")
    spread: str = Field(description="preferred, required or none: its replicas on different GPUs, hosts, zones")
    priority: str
    slo_latency_ms: int | None
    latency_critical: bool
    profile: str
    engine: str = Field(description="what runs its replicas: an engine of docs/engines.md, or auto")
    engine_args: list[str] = Field(description="its flags for its engine")
    traffic_rps: float
    observed_p95_ms: float | None
    violating: bool
    status_since: datetime | None = Field(description="when it last entered or left its SLO")
    last_scale_at: datetime | None = Field(description="when the scheduler last changed its replica count")
    max_batch_size: int
    max_batch_delay_ms: float
    standby: bool
    idle_timeout_s: int = Field(description="with min_replicas 0: seconds without requests before its replicas "
                                "leave their GPUs")
    serving: str = Field(description="what the next request meets: ready (answers at once), waking (a replica is on "
                         "its way to a GPU), asleep (wakes from host RAM on demand), cold (loads from disk on "
                         "demand), standby (loaded, takes no requests) or blocked (no replica can be placed as "
                         "things stand: a request gets 503 with the scheduler's reason)")
    last_request_at: datetime | None = Field(description="when the gateway last served or queued a request for it")
    demand: int = Field(description="requests waiting at the gateway for a ready replica (0 when the gateway has "
                        "not renewed the count for a few seconds)")
    demand_status: str = Field(description="the scheduler's answer to waiting requests: served, waiting, refused; "
                               "blocked when none wait but one would be refused; else empty")
    demand_reason: str = Field(description="why: what it woke or loaded, what it waits for, or why it cannot")
    dtype: str
    batch: int
    seq: int | None
    estimates: dict = Field(description="the estimator's breakdown per device kind (cpu, cuda), before calibration")
    adapters: list[DeploymentAdapterOut]
    state: str
    reason: str
    created: datetime
    replicas: list[ReplicaOut]


MAX_BULK = 1000
# console.deployments.models.DeploymentState (the schemas stay free of the ORM).
DeploymentState = Literal["pending", "loading", "ready", "asleep", "idle", "degraded", "failed", "unschedulable"]


class ReplicaLogsQuery(Schema):
    tail: int = Field(100, ge=1, le=1000, description="how many of the last lines, 1 to 1,000")


class ReplicaLogsOut(Schema):
    lines: list[str] = Field(description="the last lines the replica's workers wrote (stdout and stderr, every "
                             "worker of the replica in turn), oldest first; each at most 1,000 characters")


class DeploymentListQuery(ListQuery):
    state: DeploymentState | None = Field(None, description="only deployments in this state")


class DeploymentBulkIn(RequestBody):
    """Deployments to create together: all of them, or (when any is refused) none."""

    deployments: list[DeploymentIn] = Field(min_length=1, max_length=MAX_BULK,
                                            description=f"1 to {MAX_BULK} deployments, as POST /deployments takes "
                                            "each (without team); names must differ")
    team: str | None = Field(None, max_length=63, description=TEAM_FIELD + "; all of them go to it")
