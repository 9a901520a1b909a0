"""Weights whose shapes contradict config.json are refused, naming the tensor and both shapes.

The loader builds the model from config.json and then copies each tensor in; a shape that differs
fails that copy on every deploy. For the common families the shapes follow from a few config sizes,
so the check is a small table keyed by the last parts of a tensor's name (prefixes such as `model.`
or `bert.` vary between heads and checkpoints). Tensors the table does not know are left alone.

Integer weights are a quantised checkpoint's (quantisers pack several weights per stored element, in shapes of
their own), which config.json declares in `quantization_config`, and then only their shapes go unchecked. Without
one the loader builds floating-point layers, and an integer `weight` or `bias` is refused in every family: an I64
tensor at half the width spans exactly the bytes of the F32 one it stands for, so no byte count catches it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from agent.artifacts.config import ModelConfig
from agent.artifacts.config_checks import ATTENTION, head_size
from agent.artifacts.dtypes import FLOATING_SAFETENSORS
from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.safetensors_header import TensorInfo

# name suffix (dotted parts) -> (expected shape, the config sizes behind it, in words)
Rules = dict[tuple[str, ...], tuple[tuple[int, ...], str]]


def _decoder_rules(cfg: ModelConfig) -> Rules:
    """Llama, Mistral, Qwen2, Gemma and the MoE variants' attention, dense MLP and embeddings."""
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    kv, hd = cfg.int("num_key_value_heads", heads), head_size(cfg, ATTENTION["llama"])
    vocab, inter = cfg.int("vocab_size"), cfg.int("intermediate_size")
    q, kvd = f"num_attention_heads {heads} × head_dim {hd}", f"num_key_value_heads {kv} × head_dim {hd}"
    h, i, v = f"hidden_size {hidden}", f"intermediate_size {inter}", f"vocab_size {vocab}"
    rules: Rules = {
        ("self_attn", "q_proj", "weight"): ((heads * hd, hidden), f"{q}, {h}"),
        ("self_attn", "k_proj", "weight"): ((kv * hd, hidden), f"{kvd}, {h}"),
        ("self_attn", "v_proj", "weight"): ((kv * hd, hidden), f"{kvd}, {h}"),
        ("self_attn", "o_proj", "weight"): ((hidden, heads * hd), f"{h}, {q}"),
        ("self_attn", "q_proj", "bias"): ((heads * hd,), q),
        ("self_attn", "k_proj", "bias"): ((kv * hd,), kvd),
        ("self_attn", "v_proj", "bias"): ((kv * hd,), kvd),
        # `mlp.gate_proj` is the dense MLP only: experts and a shared expert sit one name part deeper
        ("mlp", "gate_proj", "weight"): ((inter, hidden), f"{i}, {h}"),
        ("mlp", "up_proj", "weight"): ((inter, hidden), f"{i}, {h}"),
        ("mlp", "down_proj", "weight"): ((hidden, inter), f"{h}, {i}"),
        ("embed_tokens", "weight"): ((vocab, hidden), f"{v}, {h}"),
        ("lm_head", "weight"): ((vocab, hidden), f"{v}, {h}"),
    }
    return rules


def _bert_rules(cfg: ModelConfig) -> Rules:
    """BERT, RoBERTa and XLM-R encoder layers and embeddings."""
    hidden, inter = cfg.int("hidden_size"), cfg.int("intermediate_size")
    positions, types = cfg.int("max_position_embeddings"), cfg.int("type_vocab_size")
    h, i = f"hidden_size {hidden}", f"intermediate_size {inter}"
    square = ((hidden, hidden), f"{h}, {h}")
    return {
        ("attention", "self", "query", "weight"): square,
        ("attention", "self", "key", "weight"): square,
        ("attention", "self", "value", "weight"): square,
        ("attention", "output", "dense", "weight"): square,
        ("intermediate", "dense", "weight"): ((inter, hidden), f"{i}, {h}"),
        ("output", "dense", "weight"): ((hidden, inter), f"{h}, {i}"),  # attention.output.dense matches first
        ("embeddings", "word_embeddings", "weight"): ((cfg.int("vocab_size"), hidden),
                                                      f"vocab_size {cfg.int('vocab_size')}, {h}"),
        ("embeddings", "position_embeddings", "weight"): ((positions, hidden), f"max_position_embeddings {positions}, "
                                                                               f"{h}"),
        ("embeddings", "token_type_embeddings", "weight"): ((types, hidden), f"type_vocab_size {types}, {h}"),
    }


RULES: dict[str, Callable[[ModelConfig], Rules]] = {"llama": _decoder_rules, "moe": _decoder_rules,
                                                    "bert": _bert_rules}
_LONGEST = 4  # name parts of the longest suffix in the tables
_PARAMETERS = ("weight", "bias")  # a layer's parameters, as opposed to buffers such as position_ids


def check_weights(cfg: ModelConfig, tensors: Iterable[TensorInfo], file: Path) -> None:
    """Refuse the first tensor of `file` whose dtype or shape differs from what `cfg` implies for its name: an
    integer weight of a checkpoint that declares no quantisation, or a shape the family's table disagrees with."""
    quantised = isinstance(cfg.raw.get("quantization_config"), dict)
    make = RULES.get(cfg.family or "")
    rules = make(cfg) if make is not None else {}
    for t in tensors:
        if t.dtype not in FLOATING_SAFETENSORS:
            if not quantised and t.name.rsplit(".", 1)[-1] in _PARAMETERS:
                raise ArtifactError(
                    f"{file}: tensor {shown(t.name)} is stored as {t.dtype} {list(t.shape)}, but {cfg.source} declares "
                    "no quantization_config, so the loader builds floating-point layers and cannot load it (a "
                    "quantised checkpoint names its method there)")
            continue
        parts = t.name.split(".")
        for n in range(min(_LONGEST, len(parts)), 0, -1):
            rule = rules.get(tuple(parts[-n:]))
            if rule is None:
                continue
            expected, why = rule
            if t.shape != expected:
                raise ArtifactError(f"{file}: tensor {shown(t.name)} has shape {list(t.shape)}, but {cfg.source} "
                                    f"implies {list(expected)} ({why})")
            break
