"""The built-in engine: the worker loads the model with torch and transformers (agent.workers.runtime) and serves
it itself. It runs every model ModelGrid can serve (causal LMs and BERT-family encoders) on CPUs and GPUs alike,
and sleeps to host memory on both."""

from __future__ import annotations

from importlib import metadata
from types import ModuleType

from agent.artifacts.capability import Device, ModelShape
from agent.engines.base import Engine


class TorchEngine(Engine):
    name = "torch"
    label = "torch"
    in_worker = True

    def refusal(self, shape: ModelShape, device: Device) -> str:
        if not shape.task:
            return (f"architecture {shape.architecture!r} is not servable: the built-in engine serves causal LMs "
                    "(*ForCausalLM) and BERT-family encoders")
        return ""

    def sleeps_on(self, device: Device) -> bool:
        return True

    def version(self, program: str | None) -> str:
        """torch's version beside the agent, from its package metadata (nothing imported)."""
        try:
            return metadata.version("torch")
        except metadata.PackageNotFoundError:
            return ""

    def loader(self) -> ModuleType:
        from agent.workers import runtime

        return runtime
