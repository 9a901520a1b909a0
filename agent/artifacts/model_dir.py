"""Recognise a Hugging Face-style model directory: config.json plus single or sharded safetensors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.artifacts.config import read_config
from agent.artifacts.dtypes import stored_dtype
from agent.artifacts.errors import ArtifactError
from agent.artifacts.safetensors_header import TensorInfo, read_safetensors_header

# Architectures (config.json "architectures") the worker knows how to serve, by task.
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
ENCODER_TYPES = ("bert", "roberta", "distilbert", "xlm-roberta", "mpnet", "electra")


@dataclass(frozen=True)
class ModelArtifact:
    path: Path
    architecture: str
    model_type: str
    task: str  # "causal-lm" or "encoder"; "" when readable and estimable but not servable
    stored_dtype: str
    weights_bytes: int
    parameters: int
    files: tuple[Path, ...]
    # What the estimator needs beyond registration: the parsed config and every tensor header.
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    tensors: tuple[TensorInfo, ...] = field(default=(), compare=False, repr=False)

    @property
    def servable(self) -> bool:
        return bool(self.task)


def servable_task(architecture: str, model_type: str) -> str:
    """The worker task for an architecture, or "" when ModelGrid cannot serve it yet."""
    if architecture.endswith(CAUSAL_LM_SUFFIXES):
        return "causal-lm"
    if model_type in ENCODER_TYPES:
        return "encoder"
    return ""


def _task_for(architecture: str, model_type: str) -> str:
    task = servable_task(architecture, model_type)
    if task:
        return task
    raise ArtifactError(
        f"architecture {architecture!r} (model_type {model_type!r}) is not servable yet: "
        "ModelGrid serves causal LMs (*ForCausalLM) and BERT-family encoders"
    )


def _weight_files(path: Path) -> tuple[Path, ...]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ArtifactError(f"{index}: not a valid safetensors index (needs 'weight_map')") from e
        files = tuple(path / name for name in sorted(set(weight_map.values())))
        for f in files:
            if not f.exists():
                raise ArtifactError(f"{index}: shard {f.name} is listed but missing")
        return files
    files = tuple(sorted(path.glob("*.safetensors")))
    if not files:
        raise ArtifactError(f"{path}: no *.safetensors weights (only safetensors are loaded, never pickles)")
    return files


def inspect_model_dir(path: str | Path) -> ModelArtifact:
    """Read config.json and safetensors headers of a model directory ModelGrid can serve; never loads weights.

    Refuses architectures the worker cannot serve (registration relies on that error); the
    estimator uses `read_model_dir`, which reads any architecture.
    """
    return _read(Path(path).expanduser(), servable_only=True, require_weights=True)


def read_model_dir(path: str | Path, *, require_weights: bool = True) -> ModelArtifact:
    """Read any model directory (servable or not); with require_weights=False a config-only one too."""
    return _read(Path(path).expanduser(), servable_only=False, require_weights=require_weights)


def _read(path: Path, *, servable_only: bool, require_weights: bool) -> ModelArtifact:
    if not path.exists():
        raise ArtifactError(f"{path}: no such directory")
    if not path.is_dir():
        raise ArtifactError(f"{path}: not a directory (a model is a directory with config.json)")
    config_path = path / "config.json"
    if not config_path.exists():
        raise ArtifactError(f"{path}: no config.json, so this is not a model directory")
    config = read_config(config_path)
    architecture, model_type = config.architecture, config.model_type
    task = _task_for(architecture, model_type) if servable_only else servable_task(architecture, model_type)

    has_weights = (path / "model.safetensors.index.json").exists() or any(path.glob("*.safetensors"))
    if not has_weights and not require_weights:
        return ModelArtifact(path.resolve(), architecture, model_type, task, "", 0, 0, (), config.raw, ())
    files = _weight_files(path)
    tensors: list[TensorInfo] = [t for f in files for t in read_safetensors_header(f)]
    if not tensors:
        raise ArtifactError(f"{path}: the safetensors files hold no tensors")
    return ModelArtifact(
        path=path.resolve(),
        architecture=architecture,
        model_type=model_type,
        task=task,
        stored_dtype=stored_dtype(tensors),
        weights_bytes=sum(t.nbytes for t in tensors),
        parameters=sum(t.numel for t in tensors),
        files=files,
        config=config.raw,
        tensors=tuple(tensors),
    )

