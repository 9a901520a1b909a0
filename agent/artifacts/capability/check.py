"""The one interface every engine's capability check implements (one module per engine, registry.py names them).

A check reads only a model's shape (shape.py: facts from config.json, safetensors headers and tokenizer.json), so
it runs torch-free wherever the decision is made: in the console when a deployment is saved, in the agent before it
starts a replica. Where a limit depends on the device (an engine's CPU build against its CUDA build), the check is
asked per device kind.
"""

from __future__ import annotations

from typing import Literal, Protocol

from agent.artifacts.capability.shape import ModelShape

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")


class EngineCheck(Protocol):
    """What one engine can run."""

    name: str

    def refusal(self, shape: ModelShape, device: Device) -> str:
        """Why this engine cannot run the model on `device`, in words a person can act on; "" when it can."""
        ...

    def sleeps_on(self, device: Device) -> bool:
        """Whether a replica of this engine can sleep (weights to host memory) on `device`."""
        ...


def device_kind(device: str) -> Device:
    """A worker's device ("cpu", "cuda:1") as the kind the checks judge."""
    return "cuda" if device.startswith("cuda") else "cpu"
