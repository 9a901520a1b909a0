"""What the engines' capability checks read of a model: its shape, from its artifact files alone (config.json,
safetensors headers, tokenizer.json), torch-free, so the console asks when a deployment is saved and the agent
before it starts a replica. The checks themselves are each engine's (agent.engines: Engine.refusal)."""

from agent.artifacts.capability.check import DEVICES, Device, device_kind
from agent.artifacts.capability.shape import ModelShape, model_shape

__all__ = ["DEVICES", "Device", "ModelShape", "device_kind", "model_shape"]
