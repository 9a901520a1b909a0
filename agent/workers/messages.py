"""What crosses a worker's pipe: one frozen dataclass per message, each way (torch-free, picklable).

Agent -> worker: Load (the first message every worker gets: its replica, and where to wait for the next agent),
Ping, Describe, Stop, Command (a forward batch, sleep, wake, adapters: `kind` is looked up in
LoadedModel.commands), Generate, Cancel. Several commands and generations may be in flight at once; each
carries the request id its answer comes back with.

Worker -> agent: Loading, Progress, Ready or Failed while it loads (its lifecycle); Pong to each Ping and a
Description to each Describe, both answered by the connection's reader thread (agent.workers.channel); Reply or
Refusal to each Command, and to each Generate once the sequence ended; Tokens after every generation step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.workers.generation_spec import EngineStats, GenerationRequest, Token
from agent.workers.spec import WorkerSpec

# A worker outlives its agent, so the next agent may be a newer version: it adopts only workers that speak its
# protocol. Bump this with any change to these messages or to WorkerSpec (they are pickled by field position).
WORKER_PROTOCOL = 2

# --- agent -> worker ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attach:
    """Where a worker waits for the next agent once its own is gone (agent.workers.rendezvous): a Unix socket in the
    agent's state directory, the agent's key that every connection must prove it holds, and how long to wait."""

    socket_path: str
    authkey: bytes
    orphan_timeout: float


@dataclass(frozen=True, slots=True)
class Load:
    """The replica a worker loads. Without `attach` the worker dies with its agent (as a spare always does); with
    `log_path` it writes its output there (agent.workers.logs).

    Only the agent that spawned a worker sends it a Load (an adopted worker gets none), so both run the same code
    and a field added here at the end needs no WORKER_PROTOCOL bump."""

    spec: WorkerSpec
    attach: Attach | None = None
    log_path: str | None = None


@dataclass(frozen=True, slots=True)
class Describe:
    """What do you run? The first message an agent sends a worker it found in its state directory."""


@dataclass(frozen=True, slots=True)
class Ping:
    number: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish the current step and exit."""


@dataclass(frozen=True, slots=True)
class Command:
    """Run `kind` (a LoadedModel.commands entry) between two generation steps; answered by Reply or Refusal."""

    kind: str
    request_id: int
    payload: Any = None


@dataclass(frozen=True, slots=True)
class Generate:
    """Start a sequence in the continuous batcher: Tokens as it goes, then a Reply (its GenerationResult)
    or a Refusal."""

    request_id: int
    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class Cancel:
    """End a sequence at the next step; it gets no Reply."""

    request_id: int


AgentMessage = Load | Ping | Describe | Stop | Command | Generate | Cancel

# --- worker -> agent ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Loading:
    """The worker began reading its checkpoint (`total_bytes` of it)."""

    model_path: str
    device: str
    pid: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Progress:
    loaded_bytes: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Ready:
    """Loaded and warmed up: what it measured (Measurement fields) and what it tells about its model."""

    measurement: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)  # LoadedModel.describe(): output_dim, max_positions...


@dataclass(frozen=True, slots=True)
class Failed:
    """The load failed; the worker exits right after sending this."""

    reason: str
    oom: bool = False


@dataclass(frozen=True, slots=True)
class Pong:
    number: int


@dataclass(frozen=True, slots=True)
class Reply:
    """A command's answer, or a generation's GenerationResult."""

    request_id: int
    value: Any


@dataclass(frozen=True, slots=True)
class Refusal:
    """A command or generation that failed; `kind` says how (a key of agent.workers.errors.ERROR_KINDS:
    "input", "oom", "timeout", "unavailable" or "error")."""

    request_id: int
    text: str
    kind: str = "error"


@dataclass(frozen=True, slots=True)
class Tokens:
    """One generation step: the tokens it made (of any sequences) and the batcher's figures after it."""

    tokens: Sequence[Token]
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class Description:
    """A worker's answer to Describe: its replica and where its lifecycle stands, for an agent to adopt it."""

    protocol: int  # WORKER_PROTOCOL of the worker's version; first, so any version's description gives it
    spec: WorkerSpec
    pid: int
    state: str  # "starting" (importing), "loading", "ready" (on the device) or "sleeping"
    next_request_id: int  # the new agent numbers its requests from here (the old agent's answers are dropped)
    loaded_bytes: int | None = None
    total_bytes: int | None = None
    measurement: dict[str, Any] | None = None  # Ready.measurement, once loaded
    info: dict[str, Any] = field(default_factory=dict)  # Ready.info
    host_bytes: int = 0  # held in host memory while asleep
    sleep_wake: dict[str, Any] | None = None  # the last sleep or wake command's figures


Lifecycle = Loading | Progress | Ready | Failed  # what the replica manager hears of (agent.workers.link)
WorkerMessage = Lifecycle | Pong | Description | Reply | Refusal | Tokens
