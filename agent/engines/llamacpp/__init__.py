"""llama.cpp's server as a replica's engine: GGUF files, quantized or not, on CPUs (and GPUs with a CUDA build).

A llama.cpp replica's worker (agent.workers.process) starts llama.cpp's server, as xllamacpp's prebuilt wheel holds
it, in the interpreter the operator names (`--llama-python`; by default the agent's own where it has xllamacpp) on
a loopback port with a key of its own (server.py, host.py), and the agent's serving passes /v1 bodies through to
it. launch.py turns a desired replica into llama-server's command line, which host.py reads,
settings.py is what a deployment may add to it, gguf_file.py reads a file's header torch-free (what the console
registers and this engine's check judges), estimate.py sizes a replica from it, failure.py finds the line of its
log that says why it failed. This module is the description: nothing of them is imported until asked.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from agent.artifacts.capability import Device, ModelShape
from agent.engines.base import Engine, Launch, Program
from agent.engines.llamacpp.gguf_file import GGUF

if TYPE_CHECKING:
    from agent.artifacts.estimate import Estimate
    from agent.artifacts.files import Roots
    from agent.artifacts.model_dir import ModelArtifact
    from agent.protocol import DesiredReplica
    from agent.protocol.engine_args import Allowlist
    from agent.workers.spec import WorkerSpec

log = logging.getLogger(__name__)

VERSION_TIMEOUT = 30.0
_VERSION = "import xllamacpp; print(xllamacpp.__version__)"


class LlamacppEngine(Engine):
    name = "llamacpp"
    label = "llama.cpp"
    passes_openai_bodies = True
    relays_metrics = True
    seq_caps_context = True  # its seq is --ctx-size, which its slots share: one request may take all of it
    program = Program("--llama-python", "MODELGRID_LLAMA_PYTHON",
                      "an interpreter with xllamacpp (llama.cpp's server; a CUDA wheel's on GPU hosts): this agent "
                      "then runs the llamacpp engine for deployments of GGUF files (default: $MODELGRID_LLAMA_PYTHON, "
                      "else this agent's own where it has xllamacpp)",
                      sys.executable if importlib.util.find_spec("xllamacpp") else None)
    model_format = GGUF

    def claims(self, path: Path) -> bool:
        from agent.engines.llamacpp.gguf_file import is_gguf

        return path.is_file() and is_gguf(path)

    def inspect(self, path: str | Path, roots: Roots = None) -> ModelArtifact:
        """The GGUF file's header as a model; ArtifactError where it is no model llama.cpp's server loads."""
        from agent.artifacts import ArtifactError
        from agent.artifacts.model_dir import model_path
        from agent.engines.llamacpp.gguf_file import file_refusal, read_gguf

        found = model_path(path, roots, kind="any")
        facts = read_gguf(found)
        if why := file_refusal(facts):
            raise ArtifactError(why)
        return facts.artifact(found.resolve())

    def shape(self, artifact: ModelArtifact, roots: Roots = None, tokenizer: bool = True) -> ModelShape:
        config = artifact.config
        return ModelShape(architecture=artifact.architecture, model_type=GGUF, task=artifact.task,
                          stored_dtype=artifact.stored_dtype, head_dim=config.get("head_dim"),
                          vocab_size=config.get("vocab_size"), tokenizer_ids=config.get("vocab_size"), format=GGUF)

    def estimate_model(self, source: str | Path | ModelArtifact, **options) -> Estimate:
        """A replica's bytes from the file's header (estimate.py): its seq is its context; dtype and batch are the
        file's and its slots'."""
        from agent.artifacts.model_dir import ModelArtifact as Artifact
        from agent.artifacts.model_dir import model_path
        from agent.engines.llamacpp.estimate import estimate_gguf
        from agent.engines.llamacpp.gguf_file import read_gguf

        found = source.files[0] if isinstance(source, Artifact) else model_path(source, options.get("roots"), "any")
        return estimate_gguf(read_gguf(found), options.get("seq"), options.get("device", "cuda"))

    def picked_by_auto(self, task: str, real_gpus: bool) -> bool:
        return task == "causal-lm"  # the one engine of its format: auto runs the files it generates with on it

    def refusal(self, shape: ModelShape, device: Device) -> str:
        from agent.engines.llamacpp.check import refusal

        return refusal(shape)

    def sleeps_on(self, device: Device) -> bool:
        return False  # no sleep mode: its replicas are stopped

    def allowlist(self) -> Allowlist:
        from agent.engines.llamacpp.settings import ALLOWLIST

        return ALLOWLIST

    def version(self, program: str | None) -> str:
        """The version of xllamacpp in `program` ("" and a warning saying why where it has none)."""
        if not program:
            return ""
        try:
            done = subprocess.run([program, "-c", _VERSION], capture_output=True, text=True, timeout=VERSION_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("no llamacpp engine: cannot run %s (%s)", program, e)
            return ""
        if done.returncode or not done.stdout.strip():
            log.warning("no llamacpp engine: %s has no xllamacpp (%s)", program,
                        done.stderr.strip()[-200:] or f"exit code {done.returncode}")
            return ""
        return done.stdout.strip()

    def start_fields(self, spec: WorkerSpec, replica: DesiredReplica) -> dict[str, tuple[object, object]]:
        # It takes its flags when it starts.
        return {"engine arguments": (spec.engine_flags, tuple(replica.engine_args))}

    def command(self, replica: DesiredReplica, device: str, weights_bytes: int, gpu_total_bytes: int = 0,
                threads: int | None = None) -> Launch:
        from agent.engines.llamacpp.launch import launch

        return launch(replica, device, threads)

    def loader(self) -> ModuleType:
        from agent.engines.llamacpp import server

        return server

    def failure_reason(self, lines: list[str]) -> str:
        from agent.engines.llamacpp.failure import failure_reason

        return failure_reason(lines)
