"""bench/generation.py's stack: `manage.py up` serving the models it built, one replica each (torch-free)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import deploy, ready_replica, register, say, wait_until
from tests.e2e.stack import ROOT, Stack

READY_TIMEOUT_S = 300.0
TINY, DECODER = "tiny-llama", "decoder"


@dataclass
class Model:
    name: str  # deployment name
    path: Path
    params: int
    adapters: dict[str, Path] = field(default_factory=dict)  # adapter name -> directory
    threads: str = "?"  # torch threads of its worker, from the worker's log


def up_args(device: str) -> tuple[str, tuple[str, ...]]:
    """`manage.py up`'s --gpus, and --cpu-threads 1 where `up` takes it (else the agent's share applies:
    2 cores over 2 simulated GPUs is 1 thread per worker here)."""
    if device == "cuda":
        return "nvml", ()
    helps = subprocess.run([sys.executable, "manage.py", "up", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60).stdout
    return "sim:2x24GiB", (("--cpu-threads", "1") if "--cpu-threads" in helps else ())


def worker_threads(stack: Stack) -> dict[str, str]:
    """Each deployment's worker thread count, as its worker logged it ("limits: torch threads: N intra-op")."""
    names, threads = {}, {}
    for line in stack.lines:
        if m := re.search(r"worker (\S+): ready: (\S+) \(", line):
            names[m.group(1)] = m.group(2)
        elif m := re.search(r"worker (\S+): limits: torch threads: (\d+) intra-op", line):
            threads[m.group(1)] = m.group(2)
    return {names[r]: threads.get(r, "torch's default") for r in names}


def serve(stack: Stack, models: list[Model], args) -> None:
    """Register and deploy every model and its adapters; wait until each answers by every name, then note each
    worker's thread count."""
    with stack.api() as api:
        for model in models:
            register(api, model.name, model.path)
            # The declared shape sizes the reservation (and the CPU worker's address-space cap) and the warm-up
            # forward: tiny-llama's covers the [64, 256] v2 request; the decoder's is kept small on a CPU, where a
            # warm-up at 32 x 128 would take over a minute (its cap still leaves room for 32 short sequences' cache:
            # it adds the checkpoint's size and a slack to the reservation).
            shape = {"batch": 64, "seq": 256, "max_batch_size": 64} if model.name == TINY else \
                {"batch": args.streams if args.device == "cuda" else 1, "seq": 128}
            deploy(api, model.name, model.name, dtype=args.dtype, **shape)
            for adapter, path in model.adapters.items():
                r = api.post("/adapters", json={"name": adapter, "deployment": model.name, "path": str(path)})
                if r.status_code != 201:
                    raise RuntimeError(f"POST /adapters {adapter}: {r.status_code} {r.text}")
        for model in models:
            wait_until(lambda n=model.name: ready_replica(api, n), READY_TIMEOUT_S, f"{model.name} to be ready", 0.5,
                       stack)
            say(f"{model.name} ready")
    with stack.gateway() as gw:
        for model in models:
            for name in (model.name, *model.adapters):
                body = {"model": name, "prompt": "hello", "max_tokens": 1, "temperature": 0}
                wait_until(lambda b=body: gw.post("/v1/completions", json=b).status_code == 200, 60,
                           f"{name} to answer", 0.5, stack)
            say(f"{model.name} answers by every name ({', '.join((model.name, *model.adapters))})")
    found = worker_threads(stack)
    for model in models:
        model.threads = found.get(model.name, "?")


def endpoint(stack: Stack, name: str) -> str:
    with stack.api() as api:
        return ready_replica(api, name)["endpoint"].rstrip("/")


def replica_pid(stack: Stack, name: str) -> int:
    with stack.api() as api:
        return ready_replica(api, name)["pid"]
