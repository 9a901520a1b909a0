"""What the built-in engine can run: every model ModelGrid can serve (causal LMs and BERT-family encoders), in
float32, float16 or bfloat16, on CPUs and GPUs alike; it sleeps to host memory on both."""

from __future__ import annotations

from agent.artifacts.capability.check import Device
from agent.artifacts.capability.shape import ModelShape


class TorchCheck:
    name = "torch"

    def refusal(self, shape: ModelShape, device: Device) -> str:
        if not shape.task:
            return (f"architecture {shape.architecture!r} is not servable: the built-in engine serves causal LMs "
                    "(*ForCausalLM) and BERT-family encoders")
        return ""

    def sleeps_on(self, device: Device) -> bool:
        return True


CHECK = TorchCheck()
