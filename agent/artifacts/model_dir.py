"""Recognise a Hugging Face-style model directory: config.json plus single or sharded safetensors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
    task: str  # "causal-lm" or "encoder"
    stored_dtype: str
    weights_bytes: int
    parameters: int
    files: tuple[Path, ...]


def _task_for(architecture: str, model_type: str) -> str:
    if architecture.endswith(CAUSAL_LM_SUFFIXES):
        return "causal-lm"
    if model_type in ENCODER_TYPES:
        return "encoder"
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
    """Read config.json and safetensors headers of a model directory; never loads weights."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ArtifactError(f"{path}: no such directory")
    if not path.is_dir():
        raise ArtifactError(f"{path}: not a directory (a model is a directory with config.json)")
    config_path = path / "config.json"
    if not config_path.exists():
        raise ArtifactError(f"{path}: no config.json, so this is not a model directory")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{config_path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(config, dict):
        raise ArtifactError(f"{config_path}: must hold a JSON object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ArtifactError(f"{config_path}: field 'model_type' is missing")
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures and isinstance(architectures[0], str) else model_type
    task = _task_for(architecture, model_type)

    files = _weight_files(path)
    tensors: list[TensorInfo] = [t for f in files for t in read_safetensors_header(f)]
    if not tensors:
        raise ArtifactError(f"{path}: the safetensors files hold no tensors")
    dtypes: dict[str, int] = {}
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.nbytes
    stored = max(dtypes, key=dtypes.get)
    return ModelArtifact(
        path=path.resolve(),
        architecture=architecture,
        model_type=model_type,
        task=task,
        stored_dtype=_TORCH_NAMES.get(stored, stored.lower()),
        weights_bytes=sum(t.nbytes for t in tensors),
        parameters=sum(t.numel for t in tensors),
        files=files,
    )


_TORCH_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
