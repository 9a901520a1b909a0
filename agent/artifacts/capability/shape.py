"""A model's shape as the engines' capability checks read it: a few facts from its artifact files, no weights.

What a fact cannot be read for (a family without the field, no tokenizer.json, one too large to read) is None,
and a check says nothing about it: the engine's own start is then the judge.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from agent.artifacts.config import ModelConfig
from agent.artifacts.errors import ArtifactError
from agent.artifacts.files import Roots, kind_of, read_json
from agent.artifacts.model_dir import SAFETENSORS, ModelArtifact

# The config fields each family names its width and head count with.
_WIDTH_AND_HEADS = {"gpt2": ("n_embd", "n_head"), "distilbert": ("dim", "n_heads")}


@dataclass(frozen=True)
class ModelShape:
    """What an engine's check needs to know of a model."""

    architecture: str
    model_type: str
    task: str  # "causal-lm", "encoder" or "" (not servable)
    stored_dtype: str
    head_dim: int | None = None  # per attention head
    vocab_size: int | None = None  # rows of its embedding, as config.json declares
    tokenizer_ids: int | None = None  # ids its tokenizer can produce (its highest id + 1)
    format: str = SAFETENSORS  # of its files: an engine runs only models of its own (Engine.model_format)


def model_shape(artifact: ModelArtifact, roots: Roots = None, tokenizer: bool = True) -> ModelShape:
    """The shape of a model directory read by inspect_model_dir/read_model_dir (its tokenizer read here, inside
    `roots` when given; not at all without `tokenizer`)."""
    cfg = ModelConfig(artifact.config)
    return ModelShape(architecture=artifact.architecture, model_type=artifact.model_type, task=artifact.task,
                      stored_dtype=artifact.stored_dtype, head_dim=head_dim(cfg), vocab_size=_int(cfg, "vocab_size"),
                      tokenizer_ids=tokenizer_ids(artifact.path, roots) if tokenizer else None,
                      format=artifact.format)


def head_dim(cfg: ModelConfig) -> int | None:
    """The width of one attention head: an explicit `head_dim`, else the model's width over its heads."""
    width, heads = _WIDTH_AND_HEADS.get(cfg.model_type, ("hidden_size", "num_attention_heads"))
    explicit = _int(cfg, "head_dim")
    if explicit:
        return explicit
    w, h = _int(cfg, width), _int(cfg, heads)
    return w // h if w and h else None


def tokenizer_ids(path: Path, roots: Roots = None) -> int | None:
    """How many ids tokenizer.json can produce (its vocabulary's and added tokens' highest id + 1); None without
    one that can be read. A file read before, unchanged since, is not parsed again (an agent asks before every
    start of a replica)."""
    file = Path(path) / "tokenizer.json"
    try:
        if kind_of(file, roots) != "file":
            return None
        seen = os.stat(file)
    except (ArtifactError, OSError):
        return None
    return _tokenizer_ids(str(file), seen.st_size, seen.st_mtime_ns,
                          None if roots is None else tuple(str(r) for r in roots))


@functools.lru_cache(maxsize=64)
def _tokenizer_ids(file: str, _size: int, _mtime_ns: int, roots: tuple[str, ...] | None) -> int | None:
    try:
        data = read_json(Path(file), roots)
    except ArtifactError:
        return None
    if not isinstance(data, dict):
        return None
    ids: list[int] = []
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        ids += [v for v in vocab.values() if isinstance(v, int) and not isinstance(v, bool)]
    elif isinstance(vocab, list):  # Unigram: [token, score] by id
        ids.append(len(vocab) - 1)
    added = data.get("added_tokens")
    if isinstance(added, list):
        ids += [t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int)
                and not isinstance(t.get("id"), bool)]
    return max(ids) + 1 if ids and max(ids) >= 0 else None


def _int(cfg: ModelConfig, key: str) -> int | None:
    try:
        return cfg.int(key) if cfg.get(key) is not None else None
    except ArtifactError:
        return None
