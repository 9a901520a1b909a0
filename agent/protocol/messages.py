"""Message types. Agent -> console: hello, report, replica_status, ack, logs. Console -> agent:
desired_state, error, logs_request. Every message is one JSON object on the websocket."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, TypeAdapter

from agent.protocol.engine_args import MAX_ARG_CHARS, MAX_ENGINE_ARGS

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


# Bounds on values, named once. Every message the schema accepts must be storable by the console on
# SQLite and PostgreSQL alike, so integers stay within the columns they land in (PostgreSQL's integer is
# 32-bit signed, bigint 64-bit signed; Python's sqlite3 overflows past 64 bits), floats are finite
# (set on _Message: JSON columns refuse Infinity and NaN), and text fits its column without a NUL
# (PostgreSQL refuses one in text and jsonb).
BIG = 2**63 - 1  # bigint: bytes, generations, counters, replica ids
SMALL = 2**31 - 1  # integer: GPU indexes, pids, batch and sequence sizes
MAX_NAME = 200  # host, GPU and deployment names (Host.name, Gpu.name)
MAX_TEXT = 4000  # free text (reasons): longer is cut, not refused, so a long error never loses a status
# GPUs per host (or in one replica's gang), and the memory of one GPU: 64 x 4 PiB stays far inside a 64-bit sum
# per host, and far beyond any real machine (an H200 has 141 GiB). The console sums a fleet's memory as a float.
MAX_GPUS = 64
MAX_GPU_BYTES = 2**52
MAX_ITEMS = 10_000  # replicas, deployments or adapters in one message (the 1 MiB message cap comes first)
MAX_LOG_LINES = 1000  # lines of a worker log in one logs reply
MAX_LOG_LINE = 1000  # characters of one log line: longer is cut

Count = Annotated[int, Field(ge=0, le=BIG)]
GpuBytes = Annotated[int, Field(ge=0, le=MAX_GPU_BYTES)]
Small = Annotated[int, Field(ge=0, le=SMALL)]
Id = Annotated[int, Field(ge=0, le=BIG)]
Size = Annotated[int, Field(ge=1, le=SMALL)]  # a batch or sequence size
Seconds = Annotated[float, Field(ge=0)]  # finite by the model config, like every float here
Percentage = Annotated[int, Field(ge=1, le=100)]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (\\u0000)")
    return value


def _text(limit: int) -> object:
    return Annotated[str, StringConstraints(max_length=limit), AfterValidator(_no_nul)]


def _clip(value: object, limit: int = MAX_TEXT) -> object:
    # Free text from an agent (an exception's message, adapters refused) is cut to MAX_TEXT and loses NULs.
    if isinstance(value, str):
        value = value.replace("\x00", "")
        if len(value) > limit:
            value = value[: limit - 1] + "…"
    return value


# An advertised inference endpoint is a base URL and nothing more. The console builds each URL to an agent from
# these parts: a path, query or user info would let an agent token choose what the console fetches (its metrics
# relay once fetched `http://127.0.0.1:PORT/any/path?` + `/metrics`).
ENDPOINT_FORM = "scheme://host:port (http or https, a host and a port only: no path, query, fragment or user info)"
# A host is a bracketed IPv6 address, or a name or IPv4 address (underscores allowed: some machines' names have them).
_ENDPOINT = re.compile(r"(?i)(https?)://(\[[0-9a-f:.]+\]|[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?)(?::([0-9]{1,5}))?")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def endpoint_parts(endpoint: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an advertised endpoint, lowercase, an IPv6 host in brackets, the scheme's port when
    none is written; None for "" (no endpoint). Raises ValueError when it is more or less than a base URL."""
    if endpoint == "":
        return None
    match = _ENDPOINT.fullmatch(endpoint)
    port = int(match.group(3)) if match and match.group(3) else None
    if match is None or port == 0 or (port or 0) > 65535:
        raise ValueError(f"an endpoint must be {ENDPOINT_FORM}, got {endpoint[:100]!r}")
    scheme, host = match.group(1).lower(), match.group(2).lower()
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"an endpoint must be {ENDPOINT_FORM}; {host} is no IPv6 address") from None
    return scheme, host, port or _DEFAULT_PORTS[scheme]


def _endpoint(value: str) -> str:
    endpoint_parts(value)
    return value


Name = _text(MAX_NAME)
Uuid = _text(100)  # Gpu.uuid
Version = _text(50)  # Host.agent_version
Endpoint = Annotated[_text(300), AfterValidator(_endpoint)]  # Host.endpoint
Text = Annotated[_text(MAX_TEXT), BeforeValidator(_clip)]
LogLine = Annotated[_text(MAX_LOG_LINE), BeforeValidator(lambda value: _clip(value, MAX_LOG_LINE))]
RequestId = Annotated[_text(64), Field(min_length=1)]


class _Message(BaseModel):
    # Unknown fields are refused: a typo in a message is an error, not silently ignored. Infinity and NaN
    # are refused in every float: the console stores them in JSON and float columns.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GpuInfo(_Message):
    index: Small
    uuid: Uuid
    name: Name
    total_bytes: GpuBytes
    used_bytes: GpuBytes
    utilization: float | None = Field(default=None, ge=0, le=100)
    simulated: bool
    # Of used_bytes, what this agent's own workers hold (loading, serving, draining or waking); the rest is
    # foreign. None: not reported (an older agent), so the console falls back to its own accounting.
    own_bytes: GpuBytes | None = None


class Measurement(_Message):
    """What a loaded replica really takes, measured by its worker after a warm-up forward."""

    device: Literal["cpu", "cuda"]
    batch: Size  # the warm-up shape actually used
    seq: Size
    weights_bytes: Count  # parameters + buffers on the device, shared storages once
    peak_bytes: Count  # cuda: max_memory_allocated during warm-up; cpu: weights + forward peak
    allocated_bytes: Count | None = None  # cuda only
    reserved_bytes: Count | None = None  # cuda only
    process_bytes: Count | None = None  # cuda only: NVML per-process memory, context included
    total_bytes: Count  # what the replica takes from its device (see docs/runtime.md)
    load_seconds: Seconds | None = None
    load_bandwidth: float | None = Field(default=None, ge=0)  # bytes/s


class SleepWake(_Message):
    """The last sleep (device -> host memory) or wake (host -> device) of a replica's weights."""

    direction: Literal["sleep", "wake"]
    bytes: Count
    seconds: Seconds
    bandwidth: float | None = Field(default=None, ge=0)  # bytes/s


class AdapterStatus(_Message):
    """One LoRA adapter in a replica's pool: where it lives now and how it has been used."""

    name: Name
    tier: Literal["gpu", "cpu", "disk"]  # device tier, host tier, or only on disk
    pinned: bool = False
    nbytes: Count
    requests: Count = 0  # rows that asked for it
    hits: Count = 0  # batches that found it on the device
    misses: Count = 0  # batches that had to swap it in


class ReplicaStatus(_Message):
    type: Literal["replica_status"] = "replica_status"
    replica_id: Id
    state: ReplicaState
    measured_bytes: Count | None = None  # equals measurement.total_bytes when measured
    loaded_bytes: Count | None = None
    total_bytes: Count | None = None
    reason: Text = ""
    pid: Small | None = None
    measurement: Measurement | None = None
    sleep_wake: SleepWake | None = None
    host_bytes: Count | None = None  # host memory held for it while sleeping
    mps_percentage: Percentage | None = None
    adapters: list[AdapterStatus] = Field(default=[], max_length=MAX_ITEMS)
    adapter_error: Text = ""  # why the last change to its adapters was refused, if it was


# What runs a replica's model: an engine's name (agent.engines lists them; an agent refuses a replica of one it does
# not run, saying so). The protocol does not list them, so a new engine needs no new protocol.
Engine = Annotated[str, StringConstraints(max_length=20, pattern=r"^[a-z][a-z0-9_-]{0,19}$")]
BUILTIN_ENGINE = "torch"  # a replica sent without one runs on the built-in engine
MAX_ENGINES = 16


class EngineInfo(_Message):
    """An engine this host's agent can run replicas with."""

    name: Engine
    version: Version


class Hello(_Message):
    type: Literal["hello"] = "hello"
    protocol: Small
    host: Annotated[Name, Field(min_length=1)]
    agent_version: Version
    endpoint: Endpoint
    gpus: list[GpuInfo] = Field(max_length=MAX_GPUS)
    # The engines it runs; none listed (an older agent): the built-in torch engine alone.
    engines: list[EngineInfo] = Field(default=[], max_length=MAX_ENGINES)


class DeploymentServing(_Message):
    """How one deployment was served on this host over the agent's recent window (default 60 s)."""

    deployment: Name
    requests: Count
    request_rate: float = Field(ge=0)  # per second
    error_rate: float = Field(ge=0, le=1)
    p50_ms: float | None = Field(default=None, ge=0)
    p95_ms: float | None = Field(default=None, ge=0)
    queue_depth: Count = 0


class HostReport(_Message):
    type: Literal["report"] = "report"
    gpus: list[GpuInfo] = Field(max_length=MAX_GPUS)
    replicas: list[ReplicaStatus] = Field(default=[], max_length=MAX_ITEMS)
    # A report lists the GPUs and replicas whose reading changed (all of them in a full one, see
    # agent/protocol/reports.py); None in these two says "as in my last report".
    serving: list[DeploymentServing] | None = Field(default=[], max_length=MAX_ITEMS)
    ram_free_bytes: Count | None = None  # room left in the sleep budget


class Ack(_Message):
    type: Literal["ack"] = "ack"
    generation: Count


class LogsReply(_Message):
    """The answer to a logs_request: the tail of the replica's worker log, or why there is none."""

    type: Literal["logs"] = "logs"
    request_id: RequestId
    replica_id: Id
    lines: list[LogLine] = Field(default=[], max_length=MAX_LOG_LINES)  # oldest first
    error: Text = ""  # non-empty: no lines, and this says why


# What the console sends is bounded the same way: it comes from the same columns.
class DesiredAdapter(_Message):
    name: Name
    path: str
    pinned: bool = False


class DesiredReplica(_Message):
    id: Id
    deployment: Name
    # Its index among the deployment's replicas: the console and its pages name it "chat#0", and so do the agent's
    # metrics. None (an older console): the metrics name it by its id.
    index: Id | None = None
    model_path: str
    architecture: str
    gpus: list[Small] = Field(max_length=MAX_GPUS)
    reserved_bytes: Count
    state: TargetState = "ready"
    dtype: str = "float32"
    batch: Size = 1  # the shape the worker warms up and measures at
    seq: Size | None = None  # None: min(max positions, 2048)
    mps_percentage: Percentage | None = None  # CUDA MPS active-thread share
    max_batch_size: Size = 8  # dynamic batching: rows per forward
    max_batch_delay_ms: float = Field(default=5.0, ge=0)  # how long the first request waits for others
    adapters: list[DesiredAdapter] = []
    adapter_pool_bytes: Count = 0  # device-tier budget for adapters
    adapter_host_bytes: Count = 0  # host-tier budget (0: as large as the device tier x 4)
    adapter_hints: dict[str, float] = {}  # expected demand per adapter, for prefetch
    engine: Engine = BUILTIN_ENGINE  # what runs it
    # The revision of its artifacts (model and adapters) it should run: a new one restarts its worker, drained,
    # even from the same paths (their files were replaced). The console rolls it across a deployment's replicas
    # one at a time. 0 (the default) is left out: an agent from before revisions refuses fields it does not know.
    revision: Count = 0
    # The deployment's own flags for its engine, checked against engine_args.py by the console and by the agent
    # before it starts one (a flag one side does not take fails that replica, saying why, not the message).
    engine_args: list[Annotated[str, StringConstraints(max_length=MAX_ARG_CHARS)]] = Field(
        default=[], max_length=MAX_ENGINE_ARGS)


class DesiredState(_Message):
    type: Literal["desired_state"] = "desired_state"
    generation: Count
    replicas: list[DesiredReplica]
    # The per-host secret the console's gateway presents to the agent's inference server as a bearer token;
    # rotated with the agent token. "" (an older console): the agent has none and serves no request.
    gateway_secret: str = Field(default="", repr=False)


class ErrorReply(_Message):
    type: Literal["error"] = "error"
    reason: str


class LogsRequest(_Message):
    """Ask for the last `tail` lines a replica's workers wrote; answered by a logs reply with the same request_id."""

    type: Literal["logs_request"] = "logs_request"
    request_id: RequestId
    replica_id: Id
    tail: int = Field(default=100, ge=1, le=MAX_LOG_LINES)


AgentMessage = Annotated[Hello | HostReport | ReplicaStatus | Ack | LogsReply, Field(discriminator="type")]
ConsoleMessage = Annotated[DesiredState | ErrorReply | LogsRequest, Field(discriminator="type")]

_agent_adapter: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)
_console_adapter: TypeAdapter[ConsoleMessage] = TypeAdapter(ConsoleMessage)


def parse_agent_message(text: str | bytes) -> Hello | HostReport | ReplicaStatus | Ack | LogsReply:
    """Validate one JSON message from an agent; raises pydantic.ValidationError."""
    return _agent_adapter.validate_json(text)


def parse_console_message(text: str | bytes) -> DesiredState | ErrorReply | LogsRequest:
    """Validate one JSON message from the console; raises pydantic.ValidationError."""
    return _console_adapter.validate_json(text)


def dump(message: BaseModel) -> str:
    return message.model_dump_json()
