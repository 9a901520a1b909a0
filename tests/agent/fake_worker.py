"""A torch-free worker process for agent tests: agent.workers.process as the agent runs it, with a stand-in runtime.

Run as the agent runs a worker (`python -m tests.agent.fake_worker <descriptor> <agent pid> spare|cold`: point
agent.workers.processes.WORKER_COMMAND here). It "loads" in milliseconds, measures 1500 bytes, and answers a
forward with logits that all hold its own pid, so a test sees which process served a request. Each load appends
"<replica id> <pid>" to the file named by MODELGRID_FAKE_LOADS, if set, so a test can count reloads. It writes a
line to stdout (print) and one straight to fd 2 (as C code does) while it loads, and one to stdout per forward; a
model directory holding a file `fail-load` makes the load fail with that file's text, and one holding `slow-forward`
makes each forward take that file's number of seconds.
"""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

WIDTH = 8
MEASUREMENT = {"device": "cpu", "batch": 1, "seq": 8, "weights_bytes": 1000, "peak_bytes": 1500, "total_bytes": 1500}
COMMAND = ("-m", "tests.agent.fake_worker")


class InputError(ValueError):
    """A request the fake model cannot take."""


class FakeModel:
    device = "cpu"
    batcher = None  # no generations: forwards, sleep and wake are what these tests need

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.asleep = False
        self.commands = {"infer": self.infer, "sleep": self.sleep, "wake": self.wake,
                         "adapter_stats": lambda _payload: {"stats": {"adapters": [], "totals": {
                             "hits": 0, "misses": 0, "evictions": 0, "adapters": 0}}}}

    def measure(self) -> dict[str, Any]:
        return dict(MEASUREMENT)

    def describe(self) -> dict[str, int]:
        return {"output_dim": WIDTH, "vocab_size": WIDTH, "max_positions": 64}

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.asleep:
            raise RuntimeError("the model is asleep: wake it before inference")
        ids = inputs["input_ids"]
        slow = Path(self.spec.model_path) / "slow-forward"
        if slow.exists():
            time.sleep(float(slow.read_text()))
        print(f"fake worker {os.getpid()}: forward of {ids.shape[0]} row(s)")
        return {"logits": np.full((*ids.shape, WIDTH), os.getpid(), dtype=np.float32)}

    def sleep(self, _payload: Any = None) -> dict[str, Any]:
        self.asleep = True
        return {"direction": "sleep", "bytes": 1000, "seconds": 0.001, "bandwidth": 1e6, "host_bytes": 1000}

    def wake(self, _payload: Any = None) -> dict[str, Any]:
        self.asleep = False
        return {"direction": "wake", "bytes": 1000, "seconds": 0.001, "bandwidth": 1e6, "host_bytes": 0}

    def recover_from_oom(self) -> None:
        pass


def load(spec: Any, progress: Any, artifact: Any = None) -> FakeModel:
    progress(0, 1000)
    print(f"fake worker {os.getpid()}: loading {spec.model_path}")
    os.write(2, f"fake worker {os.getpid()}: written to fd 2, as C code does\n".encode())
    failure = Path(spec.model_path) / "fail-load"
    if failure.exists():
        raise ValueError(failure.read_text())
    if os.environ.get("MODELGRID_FAKE_LOADS"):
        with open(os.environ["MODELGRID_FAKE_LOADS"], "a") as f:
            f.write(f"{spec.replica_id} {os.getpid()}\n")
    progress(1000, 1000)
    return FakeModel(spec)


def install() -> None:
    """Stand in for agent.workers.runtime (which imports torch) in this process."""
    runtime = types.ModuleType("agent.workers.runtime")
    runtime.load = load
    runtime.InputError = InputError
    sys.modules["agent.workers.runtime"] = runtime


if __name__ == "__main__":
    install()
    from agent.workers.process import run_from_argv

    run_from_argv()
