"""The engines' capability checks by engine name: the one place that lists them."""

from __future__ import annotations

from agent.artifacts.capability import torch_check, vllm_check
from agent.artifacts.capability.check import DEVICES, Device, EngineCheck
from agent.artifacts.capability.shape import ModelShape, model_shape
from agent.artifacts.model_dir import ModelArtifact

CHECKS: dict[str, EngineCheck] = {c.name: c for c in (torch_check.CHECK, vllm_check.CHECK)}


def refusal(engine: str, shape: ModelShape, device: Device) -> str:
    """Why `engine` cannot run a model of `shape` on `device`; "" when it can (or when no check knows the engine:
    its start is then the judge)."""
    check = CHECKS.get(engine)
    return check.refusal(shape, device) if check is not None else ""


def engine_refusal(engine: str, artifact: ModelArtifact, device: Device) -> str:
    """refusal() for a model directory read by inspect_model_dir, from its config alone: the agent asks before every
    start, on its event loop, so the tokenizer (up to 16 MiB of JSON to parse) is left to the console, which read it
    when the model was registered and refuses a deployment it rules out."""
    return refusal(engine, model_shape(artifact, tokenizer=False), device)


def refusals(shape: ModelShape) -> dict[str, dict[str, str]]:
    """Every refusal for a model of `shape`, by engine and device kind ({"vllm": {"cpu": "..."}}); only those
    that refuse are named, so {} means every engine runs it everywhere."""
    out: dict[str, dict[str, str]] = {}
    for name, check in CHECKS.items():
        found = {device: why for device in DEVICES if (why := check.refusal(shape, device))}
        if found:
            out[name] = found
    return out


def sleeps_on(engine: str, device: Device) -> bool:
    """Whether a replica of `engine` can sleep on `device` (an engine no check knows: as the built-in one)."""
    check = CHECKS.get(engine)
    return check.sleeps_on(device) if check is not None else True
