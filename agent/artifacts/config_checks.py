"""config.json that contradicts itself, or holds numbers no real model uses, is refused naming the key.

Registration is the one place such a config can be refused cheaply: past it, transformers refuses
the config on load (LlamaConfig: hidden size not a multiple of the heads), or the model builds and
dies on its first request (`rope_theta: 1e308` overflows the rotary frequencies to inf), and the
worker is restarted into the same failure again and again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from agent.artifacts.config import ModelConfig
from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.limits import (
    EPSILON_MAX,
    MAX_CONFIG_MAGNITUDE,
    MAX_ROPE_NUMBER,
    ROPE_FACTOR_MAX,
    ROPE_THETA_RANGE,
)
from agent.artifacts.params import count_parameters


@dataclass(frozen=True)
class Range:
    """A number from `low` (excluded when `above`) to `high`."""

    low: float
    high: float
    above: bool = False

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return (value > self.low if self.above else value >= self.low) and value <= self.high

    def words(self) -> str:
        return f"above {self.low:g} and at most {self.high:g}" if self.above else f"from {self.low:g} to {self.high:g}"


_THETA = Range(*ROPE_THETA_RANGE)
_EPSILON = Range(0.0, EPSILON_MAX, above=True)
_FRACTION = Range(0.0, 1.0, above=True)
# Top-level keys with a range of their own; absent or null means transformers' default.
TOP_LEVEL: dict[str, Range] = {
    "rope_theta": _THETA, "rotary_emb_base": _THETA,
    "rms_norm_eps": _EPSILON, "layer_norm_eps": _EPSILON, "layer_norm_epsilon": _EPSILON, "norm_eps": _EPSILON,
    "norm_epsilon": _EPSILON,
    "partial_rotary_factor": _FRACTION, "rotary_pct": _FRACTION,
}
# Inside rope_scaling / rope_parameters (transformers 5 moved rope_theta there); other numbers there
# are lengths, betas and per-dimension factors, all non-negative and no larger than a position count.
ROPE_KEYS: dict[str, Range] = {"rope_theta": _THETA, "factor": Range(0.0, ROPE_FACTOR_MAX, above=True),
                               "partial_rotary_factor": _FRACTION}
_ROPE_OTHER = Range(0.0, MAX_ROPE_NUMBER)


@dataclass(frozen=True)
class AttentionKeys:
    """Where a family keeps its attention sizes; `head_dim` set means an explicit per-head size may exist."""

    hidden: str
    heads: str
    kv_heads: str | None = None
    head_dim: str | None = None
    rotary: bool = False  # rotary embeddings rotate pairs of values: the head size must be even


_DECODER = AttentionKeys("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", rotary=True)
ATTENTION: dict[str, AttentionKeys] = {
    "llama": _DECODER, "moe": _DECODER,
    "gpt2": AttentionKeys("n_embd", "n_head"),
    "gpt_neox": AttentionKeys("hidden_size", "num_attention_heads"),
    "bert": AttentionKeys("hidden_size", "num_attention_heads"),
    "distilbert": AttentionKeys("dim", "n_heads"),
    "vit": AttentionKeys("hidden_size", "num_attention_heads"),
}
# transformers' LlamaConfig refuses a hidden size the heads do not divide even when head_dim is set.
ALWAYS_DIVISIBLE = frozenset({"llama"})


def check_config(cfg: ModelConfig) -> None:
    """Refuse a config whose numbers no real model uses or whose attention sizes contradict each other."""
    for key, bounds in TOP_LEVEL.items():
        value = cfg.raw.get(key)
        if value is not None and not bounds.holds(value):
            _refuse_range(cfg, key, bounds, value)
    for key in ("rope_scaling", "rope_parameters"):
        _check_rope(cfg, key, cfg.raw.get(key))
    _check_magnitudes(cfg)
    keys = ATTENTION.get(cfg.family or "")
    if keys is not None:
        _check_attention(cfg, keys)
    if cfg.family is not None:
        # the family's formula reads (and bounds) every field it uses: a malformed field is named as
        # such before the weights are compared with it
        count_parameters(cfg)


def head_size(cfg: ModelConfig, keys: AttentionKeys) -> int:
    """The per-head size: an explicit head_dim where the family has one, else hidden / heads."""
    explicit = cfg.get(keys.head_dim) if keys.head_dim else None
    if explicit is not None:
        return cfg.int(keys.head_dim)
    return cfg.int(keys.hidden) // cfg.int(keys.heads)


def _check_attention(cfg: ModelConfig, keys: AttentionKeys) -> None:
    hidden, heads = cfg.int(keys.hidden), cfg.int(keys.heads)
    explicit = keys.head_dim is not None and cfg.get(keys.head_dim) is not None
    if hidden % heads and (not explicit or cfg.model_type in ALWAYS_DIVISIBLE):
        why = (f"transformers refuses a {cfg.model_type} config like that even with head_dim set" if explicit
               else f"{cfg.model_type} attention splits the hidden size into equal heads")
        raise ArtifactError(f"{cfg.source}: field {keys.hidden!r} is {hidden}, not a multiple of {keys.heads} "
                            f"({heads}); {why}")
    if keys.kv_heads:
        kv = cfg.int(keys.kv_heads, heads)
        if kv > heads:
            raise ArtifactError(f"{cfg.source}: field {keys.kv_heads!r} is {kv}, more than {keys.heads} ({heads}); "
                                "grouped-query attention shares each key/value head among query heads")
        if heads % kv:
            raise ArtifactError(f"{cfg.source}: field {keys.kv_heads!r} is {kv}, which does not divide {keys.heads} "
                                f"({heads}); grouped-query attention gives each key/value head the same number of "
                                "query heads")
    rope = cfg.raw.get("rope_parameters")
    # a partial rotary factor rotates part of each head only; that part's parity is the model's business
    partial = cfg.raw.get("partial_rotary_factor") is not None or (
        isinstance(rope, dict) and rope.get("partial_rotary_factor") is not None)
    size = head_size(cfg, keys)
    if keys.rotary and not partial and size % 2:
        what = (f"field {keys.head_dim!r} is {size}" if explicit
                else f"a head size of {size} ({keys.hidden} {hidden} / {keys.heads} {heads})")
        raise ArtifactError(f"{cfg.source}: {what}; rotary position embeddings rotate pairs of values, so the head "
                            "size must be even")


def _check_rope(cfg: ModelConfig, key: str, value: Any, depth: int = 0) -> None:
    """rope_scaling / rope_parameters: an object (per layer type, one level of objects more) or null."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ArtifactError(f"{cfg.source}: field {shown(key)} must be an object or null, got {shown(value)}")
    for name, item in value.items():
        path = f"{key}.{name}"
        if isinstance(item, dict):
            if depth:
                raise ArtifactError(f"{cfg.source}: field {shown(path)} nests rope parameters deeper than one "
                                    "object per layer type")
            _check_rope(cfg, path, item, depth + 1)
        elif isinstance(item, list):
            if not all(_ROPE_OTHER.holds(v) for v in item):
                _refuse_range(cfg, path, _ROPE_OTHER, item, "a list of numbers ")
        elif name in ROPE_KEYS or (item is not None and not isinstance(item, str | bool)):
            bounds = ROPE_KEYS.get(name, _ROPE_OTHER)
            if not bounds.holds(item):
                _refuse_range(cfg, path, bounds, item)


def _check_magnitudes(cfg: ModelConfig) -> None:
    """Any float anywhere in the config (nested configs, lists) is at most MAX_CONFIG_MAGNITUDE in size."""
    stack: list[tuple[str, Any]] = [(k, v) for k, v in cfg.raw.items()]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((path, v) for v in value)
        elif isinstance(value, float) and not abs(value) <= MAX_CONFIG_MAGNITUDE:
            raise ArtifactError(
                f"{cfg.source}: field {shown(path)} is {value:g}; no model uses a number beyond "
                f"±{MAX_CONFIG_MAGNITUDE:g} (the worker's float arithmetic would overflow to inf)"
            )


def _refuse_range(cfg: ModelConfig, key: str, bounds: Range, value: Any, what: str = "a number ") -> NoReturn:
    raise ArtifactError(f"{cfg.source}: field {shown(key)} must be {what}{bounds.words()}, got {shown(value)}")
