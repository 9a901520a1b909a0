"""What each engine can run, judged from a model's artifact facts alone (config.json, safetensors headers,
tokenizer.json): torch-free, so the console asks when a deployment is saved and the agent before it starts a replica.

One module per engine (torch_check, vllm_check) behind one interface (check.EngineCheck), and one registry keyed by
engine name (registry.CHECKS). They live in agent.artifacts because the console may import only agent.protocol
and agent.artifacts from the agent, and they read nothing but artifact facts; each engine's module moves as it is
into that engine's own package when engines get one.
"""

from agent.artifacts.capability.check import DEVICES, Device, EngineCheck, device_kind
from agent.artifacts.capability.registry import CHECKS, engine_refusal, refusal, refusals, sleeps_on
from agent.artifacts.capability.shape import ModelShape, model_shape

__all__ = ["CHECKS", "DEVICES", "Device", "EngineCheck", "ModelShape", "device_kind", "engine_refusal", "model_shape",
           "refusal", "refusals", "sleeps_on"]
