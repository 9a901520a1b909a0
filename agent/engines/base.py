"""The one interface every engine implements: what it can run, its settings, how its replicas start, sleep and
are relayed to, and why one failed. Callers ask the engine (`engine.sleeps_on("cuda")`,
`engine.passes_openai_bodies`) instead of comparing its name.

An engine's description (its package's __init__, a subclass of Engine) is imported by the console too: it is
torch-free, Django-free and does no I/O at import. What runs (a loader in the worker, a server process, its
command line) lives in modules of the engine's package that the description imports only when asked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar

from agent.artifacts.model_dir import SAFETENSORS

if TYPE_CHECKING:
    from agent.artifacts.capability import Device, ModelShape
    from agent.artifacts.estimate import Estimate
    from agent.artifacts.files import Roots
    from agent.artifacts.model_dir import ModelArtifact
    from agent.protocol import DesiredReplica
    from agent.protocol.engine_args import Allowlist, EngineSettings
    from agent.workers.spec import WorkerSpec


@dataclass(frozen=True)
class Program:
    """What an engine that runs a program of its own needs told on the agent's command line (the interpreter
    of a vLLM environment): the flag, the environment variable that defaults it, a help line, and the default
    where that is unset (None: the engine is not run)."""

    flag: str
    env: str
    help: str
    default: str | None = None


@dataclass(frozen=True)
class Launch:
    """How to start one replica's engine process: argv after the program, and the environment it adds."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


class Engine(ABC):
    """One engine: a description the console and the agent share, with hooks into its runtime modules."""

    name: ClassVar[str]  # its registry key: the deployment's `engine` and the agent's hello name it so
    label: ClassVar[str]  # as people read it ("vLLM")
    # The model runs inside the worker process with the agent's own interpreter (warm spares hold it, CPU caps and
    # the v2 tensor API apply). False: the worker starts the engine's own server and the agent relays to it.
    in_worker: ClassVar[bool] = False
    # OpenAI bodies for its replicas are relayed unchanged to its server (its own features work; no v2 tensors).
    passes_openai_bodies: ClassVar[bool] = False
    # Its server exposes Prometheus /metrics, relayed on the agent's own with replica labels.
    relays_metrics: ClassVar[bool] = False
    # Only one replica of it starts at a time on one GPU (its start profiles the free memory).
    starts_one_per_gpu: ClassVar[bool] = False
    # A deployment's `seq` caps the tokens per sequence its replicas take (else the model's positions do).
    seq_caps_context: ClassVar[bool] = False
    # The flag that names its program on the agent's command line; None: it needs none (the built-in engine).
    program: ClassVar[Program | None] = None
    # The format of the models it runs: a directory of config.json and safetensors, or a format of its own, whose
    # files it recognises (claims), reads (inspect, shape) and sizes (estimate_model) itself.
    model_format: ClassVar[str] = SAFETENSORS

    # --- a model's files (torch-free; the console reads them at registration and sizing, the agent before a start)
    def claims(self, path: Path) -> bool:
        """Whether `path` (resolved inside the model roots) is a model in this engine's own format; never for the
        safetensors directories every engine of that format reads."""
        return False

    def inspect(self, path: str | Path, roots: Roots = None) -> ModelArtifact:
        """A model's files as this engine reads them, no weights loaded: its task, architecture, config and weight
        bytes (registration, the agent's check before a start, the worker's load). ArtifactError naming what is
        wrong."""
        from agent.artifacts import inspect_model_dir

        return inspect_model_dir(path, roots)

    def shape(self, artifact: ModelArtifact, roots: Roots = None, tokenizer: bool = True) -> ModelShape:
        """What the capability checks read of a model inspected by this engine (its tokenizer too, unless not
        `tokenizer`)."""
        from agent.artifacts.capability import model_shape

        return model_shape(artifact, roots, tokenizer)

    def estimate_model(self, source: str | Path | ModelArtifact, **options) -> Estimate:
        """The memory a replica of the model at `source` (or inspected) takes before this engine's own runtime
        (agent.artifacts.estimate's options: dtype, batch, seq, device, adapter_pool_bytes, roots)."""
        from agent.artifacts.estimate import estimate

        return estimate(source, **options)

    @abstractmethod
    def refusal(self, shape: ModelShape, device: Device) -> str:
        """Why this engine cannot run a model of `shape` on `device` ("cpu" or "cuda"), in words a person can act
        on; "" when it can (or when the files cannot tell: its start is then the judge)."""

    @abstractmethod
    def sleeps_on(self, device: Device) -> bool:
        """Whether a replica of this engine can sleep (weights to host memory, GPU memory freed) on `device`."""

    def picked_by_auto(self, task: str, real_gpus: bool) -> bool:
        """Whether a deployment with engine "auto" runs on this engine for a model of `task` on a host with (or
        without) real GPUs, where the host runs it and it does not refuse the model there."""
        return False

    # --- its settings: the checked allowlist of what a deployment may add to its command line
    def allowlist(self) -> Allowlist | None:
        """The flags and values a deployment may give it (agent.protocol.engine_args); None: it takes none."""
        return None

    def parse_settings(self, args: list[str], gpus: int | None = None) -> EngineSettings:
        """`args` checked flag by flag and value by value; EngineArgsError naming the first at fault. With `gpus`,
        flags that span GPUs must span exactly that many."""
        from agent.protocol.engine_args import EngineArgsError, EngineSettings, parse_engine_args

        allowed = self.allowlist()
        if allowed is not None:
            return parse_engine_args(args, allowed, gpus)
        if args:
            raise EngineArgsError(f"engine {self.name} takes no engine arguments")
        return EngineSettings()

    def settings_problem(self, args: list[str], gpus: int | None = None) -> str | None:
        """Why `args` cannot be given to this engine, naming the first at fault; None when they all can."""
        from agent.protocol.engine_args import EngineArgsError

        try:
            self.parse_settings(args, gpus)
        except EngineArgsError as e:
            return str(e)
        return None

    # --- sizing
    def estimate(self, est: Estimate) -> Estimate:
        """The artifact estimate `est` for a replica run by this engine (its runtime's own memory added)."""
        return est

    def adapter_restart_reason(self, deployment: str, served_ranks: list[int], rank: int) -> str:
        """Why running replicas (started for adapters of `served_ranks`; [] for none) cannot take a new adapter of
        `rank` until they restart; "" when they can."""
        return ""

    # --- on the host (the agent)
    def start_fields(self, spec: WorkerSpec, replica: DesiredReplica) -> dict[str, tuple[object, object]]:
        """What a running replica (`spec`) took when its engine started that `replica` changes, as {what: (running,
        desired)}: any that differ restart it."""
        return {}

    @abstractmethod
    def version(self, program: str | None) -> str:
        """This engine's version where this host runs it (`program`: what the agent was told by its `program` flag);
        "" where it does not. Blocking."""

    def command(self, replica: DesiredReplica, device: str, weights_bytes: int, gpu_total_bytes: int = 0,
                threads: int | None = None) -> Launch | None:
        """Daemon side: the command line and environment of `replica`'s engine process on `device`; None for an
        engine that runs in the worker. ArtifactError when its files or settings rule it out."""
        return None

    @abstractmethod
    def loader(self) -> ModuleType:
        """Worker side: the module whose `load(spec, progress, artifact)` loads the replica and returns the worker's
        model (its commands: adapters, sleep, wake; describe, measure; `watch` for an engine in processes of its
        own), and whose InputError is a request the engine refuses."""

    def kill_leftovers(self, leader: int) -> list[int]:
        """What is left of a replica's engine processes after its worker died (`leader`: the session it started),
        killed; the pids."""
        return []

    def failure_reason(self, lines: list[str]) -> str:
        """The one line of the engine's output (`lines`, oldest first) that says why it failed; "" for none."""
        return ""

    def __repr__(self) -> str:
        return f"<engine {self.name}>"

