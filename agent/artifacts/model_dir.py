"""Recognise a Hugging Face-style model directory: config.json plus single or sharded safetensors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.artifacts.config import read_config
from agent.artifacts.config_checks import check_config
from agent.artifacts.dtypes import stored_dtype
from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.files import Roots, kind_of, list_dir, read_json, real_path
from agent.artifacts.roots import Kind, resolve_in_roots
from agent.artifacts.safetensors_header import TensorInfo, read_safetensors_header
from agent.artifacts.tree import check_tree
from agent.artifacts.weight_shapes import check_weights

# Architectures (config.json "architectures") the worker knows how to serve, by task.
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
ENCODER_TYPES = ("bert", "roberta", "distilbert", "xlm-roberta", "mpnet", "electra")
# The format of a model directory read here; an engine that reads another (agent.engines: Engine.model_format)
# makes its artifacts itself.
SAFETENSORS = "safetensors"


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
    format: str = SAFETENSORS

    @property
    def servable(self) -> bool:
        return bool(self.task)

    @property
    def sources(self) -> tuple[Path, ...]:
        """The files its facts were read from (a change to any is a change to the model)."""
        return (self.path / "config.json", *self.files) if self.format == SAFETENSORS else self.files


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


def _weight_files(path: Path, roots: Roots) -> tuple[Path, ...]:
    index = path / "model.safetensors.index.json"
    if kind_of(index, roots) != "missing":
        weight_map = read_json(index, roots)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ArtifactError(f"{index}: not a valid safetensors index (needs 'weight_map', tensor -> shard file)")
        names = sorted(set(weight_map.values()))
        for name in names:
            # a shard is a file next to the index: no directories, no way out of the model directory
            if not name.endswith(".safetensors") or os.sep in name or name.startswith("."):
                raise ArtifactError(f"{index}: field 'weight_map' names shard {shown(name)}; shards must be "
                                    "*.safetensors file names in the model directory")
        files = tuple(path / name for name in names)
        for f in files:
            if kind_of(f, roots) == "missing":
                raise ArtifactError(f"{index}: shard {f.name} is listed but missing")
        return files
    files = tuple(list_dir(path, ".safetensors"))
    if not files:
        raise ArtifactError(f"{path}: no *.safetensors weights (only safetensors are loaded, never pickles)")
    return files


def model_path(path: str | Path, roots: Roots, kind: Kind = "dir") -> Path:
    """The path to read: inside `roots` (resolved) when given, else as given with `~` expanded."""
    if roots is not None:
        return resolve_in_roots(path, roots, kind=kind)
    if "\0" in str(path):
        raise ArtifactError(f"{shown(str(path))}: not a valid path (it contains a NUL character)")
    return Path(path).expanduser()


def inspect_model_dir(path: str | Path, roots: Roots = None) -> ModelArtifact:
    """Read config.json and safetensors headers of a model directory ModelGrid can serve; never loads weights.

    Refuses architectures the worker cannot serve (registration relies on that error); the
    estimator uses `read_model_dir`, which reads any architecture. With `roots`, the directory
    and every file read must resolve inside them.
    """
    return _read(model_path(path, roots), servable_only=True, require_weights=True, roots=roots)


def read_model_dir(path: str | Path, *, require_weights: bool = True, roots: Roots = None) -> ModelArtifact:
    """Read any model directory (servable or not); with require_weights=False a config-only one too."""
    return _read(model_path(path, roots), servable_only=False, require_weights=require_weights, roots=roots)


def _read(path: Path, *, servable_only: bool, require_weights: bool, roots: Roots) -> ModelArtifact:
    kind = kind_of(path, roots)
    if kind == "missing":
        raise ArtifactError(f"{path}: no such directory")
    if kind != "dir":
        raise ArtifactError(f"{path}: not a directory (a model is a directory with config.json)")
    config_path = path / "config.json"
    if kind_of(config_path, roots) == "missing":
        raise ArtifactError(f"{path}: no config.json, so this is not a model directory")
    check_tree(path, roots)  # the files read later (tokenizer, chat template) as well as those read here
    config = read_config(config_path, roots)
    check_config(config)
    architecture, model_type = config.architecture, config.model_type
    task = _task_for(architecture, model_type) if servable_only else servable_task(architecture, model_type)

    real = real_path(path, roots)
    index = path / "model.safetensors.index.json"
    has_weights = kind_of(index, roots) != "missing" or bool(list_dir(path, ".safetensors"))
    if not has_weights and not require_weights:
        return ModelArtifact(real, architecture, model_type, task, "", 0, 0, (), config.raw, ())
    files = _weight_files(path, roots)
    tensors: list[TensorInfo] = []
    for f in files:
        found = read_safetensors_header(f, roots)
        check_weights(config, found, f)
        tensors += found
    if not tensors:
        raise ArtifactError(f"{path}: the safetensors files hold no tensors")
    return ModelArtifact(
        path=real,
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
