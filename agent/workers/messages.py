"""What crosses a worker's pipe: one frozen dataclass per message, each way (torch-free, picklable).

Agent -> worker: Load (to a warm spare only), Ping, Stop, Command (a forward batch, sleep, wake, adapters:
`kind` is looked up in LoadedModel.commands), Generate, Cancel. Several commands and generations may be
in flight at once; each carries the request id its answer comes back with.

Worker -> agent: Loading, Progress, Ready or Failed while it loads (its lifecycle); Pong to each Ping,
answered by the pipe's reader thread (agent.workers.channel); Reply or Refusal to each Command, and to
each Generate once the sequence ended; Tokens after every generation step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.workers.generation_spec import EngineStats, GenerationRequest, Token
from agent.workers.spec import WorkerSpec

# --- agent -> worker ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Load:
    """A warm spare's replica: it loads this spec as if it had been spawned with it."""

    spec: WorkerSpec


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


AgentMessage = Load | Ping | Stop | Command | Generate | Cancel

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


Lifecycle = Loading | Progress | Ready | Failed  # what the replica manager hears of (agent.workers.link)
WorkerMessage = Lifecycle | Pong | Reply | Refusal | Tokens
