"""A model's serving shape: the facts its deployments and adapters are built against.

A deployment answers the endpoints of its model's task, runs the engine chosen for its architecture, and hands
clients token ids of its vocabulary and vectors of its hidden size; a LoRA adapter holds matrices sized by the
hidden size and the layer stack. New weights of the same shape (a fine-tune, a fix) serve them all; another shape
is another model. Read from config.json (with the family's defaults), torch-free.
"""

from __future__ import annotations

from typing import Any

from agent.artifacts.config import ModelConfig
from agent.artifacts.model_dir import ModelArtifact

# fact -> its words; the config keys families name it by, first found wins
SHAPE_WORDS = {"format": "format", "architecture": "architecture", "task": "task", "hidden_size": "hidden size",
               "vocab_size": "vocabulary size", "layers": "layers"}
_KEYS = {"hidden_size": ("hidden_size", "n_embd", "dim", "d_model"), "vocab_size": ("vocab_size",),
         "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers")}


def serving_shape(artifact: ModelArtifact) -> dict[str, Any]:
    """The artifact's SHAPE_WORDS facts; a size its config does not state is None."""
    cfg = ModelConfig(artifact.config) if artifact.config.get("model_type") else None
    shape: dict[str, Any] = {"format": artifact.format, "architecture": artifact.architecture, "task": artifact.task}
    for fact, keys in _KEYS.items():
        value = next((cfg.get(k) for k in keys if cfg is not None and cfg.get(k) is not None), None)
        shape[fact] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return shape


def shape_changes(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """How `now` differs from `was`, fact by fact in words ("hidden size 16 -> 32"), for the facts both state."""
    return [f"{words} {was[fact]} -> {now[fact]}" for fact, words in SHAPE_WORDS.items()
            if was.get(fact) is not None and now.get(fact) is not None and was[fact] != now[fact]]
