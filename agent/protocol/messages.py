"""Message types. Agent -> console: hello, report, replica_status, ack. Console -> agent:
desired_state, error. Every message is one JSON object on the websocket."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL_VERSION = 1

# Observed states a replica can report; `pending` means placed but not yet started by an agent,
# `starting` that its worker process exists but has not begun reading weights, `preloaded` that its
# weights are on its GPUs and warmed up but it takes no requests until its target becomes `ready`.
REPLICA_STATES = ("pending", "starting", "loading", "ready", "preloaded", "sleeping", "stopped", "failed")
ReplicaState = Literal["pending", "starting", "loading", "ready", "preloaded", "sleeping", "stopped", "failed"]
TargetState = Literal["ready", "preloaded", "sleeping", "stopped"]

# Groups of those states, named once here for the agent's replica manager, workers and server.
LOADING = ("pending", "starting", "loading")  # on its way: no weights to serve from yet
ON_DEVICE = ("ready", "preloaded")  # weights on its GPUs (preloaded ones take no requests)
LOADED = (*ON_DEVICE, "sleeping")  # loaded and measured: on the device, or in host memory
LIVE_STATES = ("starting", "loading", *LOADED)  # a worker process runs (its pid is reported)
ENDED = ("stopped", "failed")  # no worker serves it until it is started again
RESTING = ("sleeping", "preloaded", "stopped")  # where the console wants it, not on its way to serving


class _Message(BaseModel):
    # Unknown fields are refused: a typo in a message is an error, not silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuInfo(_Message):
    index: int = Field(ge=0)
    uuid: str
    name: str
    total_bytes: int = Field(ge=0)
    used_bytes: int = Field(ge=0)
    utilization: float | None = Field(default=None, ge=0, le=100)
    simulated: bool
    # Of used_bytes, what this agent's own workers hold (loading, serving, draining or waking); the rest is
    # foreign. None: not reported (an older agent), so the console falls back to its own accounting.
    own_bytes: int | None = Field(default=None, ge=0)


class Measurement(_Message):
    """What a loaded replica really takes, measured by its worker after a warm-up forward."""

    device: Literal["cpu", "cuda"]
    batch: int = Field(ge=1)  # the warm-up shape actually used
    seq: int = Field(ge=1)
    weights_bytes: int = Field(ge=0)  # parameters + buffers on the device, shared storages once
    peak_bytes: int = Field(ge=0)  # cuda: max_memory_allocated during warm-up; cpu: weights + forward peak
    allocated_bytes: int | None = Field(default=None, ge=0)  # cuda only
    reserved_bytes: int | None = Field(default=None, ge=0)  # cuda only
    process_bytes: int | None = Field(default=None, ge=0)  # cuda only: NVML per-process memory, context included
    total_bytes: int = Field(ge=0)  # what the replica takes from its device (see docs/runtime.md)
    load_seconds: float | None = Field(default=None, ge=0)
    load_bandwidth: float | None = Field(default=None, ge=0)  # bytes/s


class SleepWake(_Message):
    """The last sleep (device -> host memory) or wake (host -> device) of a replica's weights."""

    direction: Literal["sleep", "wake"]
    bytes: int = Field(ge=0)
    seconds: float = Field(ge=0)
    bandwidth: float | None = Field(default=None, ge=0)  # bytes/s


class AdapterStatus(_Message):
    """One LoRA adapter in a replica's pool: where it lives now and how it has been used."""

    name: str
    tier: Literal["gpu", "cpu", "disk"]  # device tier, host tier, or only on disk
    pinned: bool = False
    nbytes: int = Field(ge=0)
    requests: int = Field(default=0, ge=0)  # rows that asked for it
    hits: int = Field(default=0, ge=0)  # batches that found it on the device
    misses: int = Field(default=0, ge=0)  # batches that had to swap it in


class ReplicaStatus(_Message):
    type: Literal["replica_status"] = "replica_status"
    replica_id: int
    state: ReplicaState
    measured_bytes: int | None = Field(default=None, ge=0)  # equals measurement.total_bytes when measured
    loaded_bytes: int | None = Field(default=None, ge=0)
    total_bytes: int | None = Field(default=None, ge=0)
    reason: str = ""
    pid: int | None = None
    measurement: Measurement | None = None
    sleep_wake: SleepWake | None = None
    host_bytes: int | None = Field(default=None, ge=0)  # host memory held for it while sleeping
    mps_percentage: int | None = Field(default=None, ge=1, le=100)
    adapters: list[AdapterStatus] = []
    adapter_error: str = ""  # why the last change to its adapters was refused, if it was


class Hello(_Message):
    type: Literal["hello"] = "hello"
    protocol: int
    host: str = Field(min_length=1, max_length=200)
    agent_version: str
    endpoint: str
    gpus: list[GpuInfo]


class DeploymentServing(_Message):
    """How one deployment was served on this host over the agent's recent window (default 60 s)."""

    deployment: str
    requests: int = Field(ge=0)
    request_rate: float = Field(ge=0)  # per second
    error_rate: float = Field(ge=0, le=1)
    p50_ms: float | None = Field(default=None, ge=0)
    p95_ms: float | None = Field(default=None, ge=0)
    queue_depth: int = Field(default=0, ge=0)


class HostReport(_Message):
    type: Literal["report"] = "report"
    gpus: list[GpuInfo]
    replicas: list[ReplicaStatus] = []
    serving: list[DeploymentServing] = []
    ram_free_bytes: int | None = Field(default=None, ge=0)  # room left in the sleep budget


class Ack(_Message):
    type: Literal["ack"] = "ack"
    generation: int = Field(ge=0)


class DesiredAdapter(_Message):
    name: str
    path: str
    pinned: bool = False


class DesiredReplica(_Message):
    id: int
    deployment: str
    model_path: str
    architecture: str
    gpus: list[int]
    reserved_bytes: int = Field(ge=0)
    state: TargetState = "ready"
    dtype: str = "float32"
    batch: int = Field(default=1, ge=1)  # the shape the worker warms up and measures at
    seq: int | None = Field(default=None, ge=1)  # None: min(max positions, 2048)
    mps_percentage: int | None = Field(default=None, ge=1, le=100)  # CUDA MPS active-thread share
    max_batch_size: int = Field(default=8, ge=1)  # dynamic batching: rows per forward
    max_batch_delay_ms: float = Field(default=5.0, ge=0)  # how long the first request waits for others
    adapters: list[DesiredAdapter] = []
    adapter_pool_bytes: int = Field(default=0, ge=0)  # device-tier budget for adapters
    adapter_host_bytes: int = Field(default=0, ge=0)  # host-tier budget (0: as large as the device tier x 4)
    adapter_hints: dict[str, float] = {}  # expected demand per adapter, for prefetch


class DesiredState(_Message):
    type: Literal["desired_state"] = "desired_state"
    generation: int = Field(ge=0)
    replicas: list[DesiredReplica]
    # The per-host secret the console's gateway presents to the agent's inference server as a bearer token;
    # rotated with the agent token. "" (an older console): the agent has none and serves no request.
    gateway_secret: str = Field(default="", repr=False)


class ErrorReply(_Message):
    type: Literal["error"] = "error"
    reason: str


AgentMessage = Annotated[Hello | HostReport | ReplicaStatus | Ack, Field(discriminator="type")]
ConsoleMessage = Annotated[DesiredState | ErrorReply, Field(discriminator="type")]

_agent_adapter: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)
_console_adapter: TypeAdapter[ConsoleMessage] = TypeAdapter(ConsoleMessage)


def parse_agent_message(text: str | bytes) -> Hello | HostReport | ReplicaStatus | Ack:
    """Validate one JSON message from an agent; raises pydantic.ValidationError."""
    return _agent_adapter.validate_json(text)


def parse_console_message(text: str | bytes) -> DesiredState | ErrorReply:
    """Validate one JSON message from the console; raises pydantic.ValidationError."""
    return _console_adapter.validate_json(text)


def dump(message: BaseModel) -> str:
    return message.model_dump_json()
