"""config.json reading with the defaults transformers would fill in, and family detection.

`save_pretrained` writes only the fields that differ from a config class's defaults, so a
formula that reads config.json must know those defaults (taken from transformers 5 config
classes) or it would count a different model than the one that gets loaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.files import read_json
from agent.artifacts.limits import MAX_CONFIG_FLOAT, MAX_LIST, config_int_max

# model_type -> family; a family shares one parameter formula.
FAMILIES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma": "llama",
    "mixtral": "moe", "qwen2_moe": "moe",
    "gpt2": "gpt2", "gpt_neox": "gpt_neox",
    "bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": "distilbert",
    "t5": "t5", "vit": "vit", "resnet": "resnet", "mobilenet_v2": "mobilenet_v2",
}
DECODER_FAMILIES = frozenset({"llama", "moe", "gpt2", "gpt_neox"})

_COMMON_DECODER = {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "head_dim": None,
                   "sliding_window": None, "rms_norm_eps": 1e-6}
_BERT = {"vocab_size": 30522, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
         "num_attention_heads": 12, "max_position_embeddings": 512, "type_vocab_size": 2}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": _COMMON_DECODER | {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                                "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048},
    "mistral": _COMMON_DECODER | {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "max_position_embeddings": 131072, "sliding_window": 4096},
    "qwen2": _COMMON_DECODER | {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                                "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 32768,
                                "use_sliding_window": False, "max_window_layers": 28},
    "gemma": _COMMON_DECODER | {"vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
                                "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
                                "head_dim": 256, "tie_word_embeddings": True, "max_position_embeddings": 8192},
    "mixtral": _COMMON_DECODER | {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "max_position_embeddings": 131072, "num_local_experts": 8,
                                  "num_experts_per_tok": 2},
    "qwen2_moe": _COMMON_DECODER | {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                                    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                                    "max_position_embeddings": 32768, "use_sliding_window": False,
                                    "max_window_layers": 28, "num_experts": 60, "num_experts_per_tok": 4,
                                    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                                    "decoder_sparse_step": 1, "mlp_only_layers": [], "qkv_bias": True},
    "gpt2": {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "n_positions": 1024,
             "tie_word_embeddings": True},
    "gpt_neox": {"vocab_size": 50432, "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 44,
                 "num_attention_heads": 64, "tie_word_embeddings": False, "attention_bias": True,
                 "max_position_embeddings": 2048},
    "bert": _BERT | {"tie_word_embeddings": True},
    "roberta": _BERT | {"vocab_size": 50265, "tie_word_embeddings": True},
    "xlm-roberta": _BERT | {"tie_word_embeddings": True},
    "distilbert": {"vocab_size": 30522, "dim": 768, "hidden_dim": 3072, "n_heads": 12, "n_layers": 6,
                   "max_position_embeddings": 512, "tie_word_embeddings": True},
    "t5": {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": None,
           "num_heads": 8, "relative_attention_num_buckets": 32, "feed_forward_proj": "relu",
           "tie_word_embeddings": True},
    "vit": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
            "image_size": 224, "patch_size": 16, "num_channels": 3, "qkv_bias": True},
    "resnet": {"num_channels": 3, "embedding_size": 64, "hidden_sizes": [256, 512, 1024, 2048],
               "depths": [3, 4, 6, 3], "layer_type": "bottleneck", "downsample_in_first_stage": False,
               "image_size": 224},
    "mobilenet_v2": {"image_size": 224, "num_channels": 3, "depth_multiplier": 1.0, "depth_divisible_by": 8,
                     "min_depth": 8, "expand_ratio": 6.0, "output_stride": 32, "first_layer_is_expansion": True,
                     "finegrained_output": True},
}


@dataclass(frozen=True)
class ModelConfig:
    """A parsed config.json: raw values, the family's defaults, and the file to name in errors.

    Every number is read through `int`, `int_list` or `number`, which hold it to the bounds in
    limits.py: a config is untrusted input and its numbers size arithmetic and memory.
    """

    raw: dict[str, Any]
    source: str = "config.json"
    values: dict[str, Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.raw, dict):
            raise ArtifactError(f"{self.source}: must hold a JSON object")
        model_type = self.raw.get("model_type")
        if not isinstance(model_type, str):
            raise ArtifactError(f"{self.source}: field 'model_type' is missing")
        object.__setattr__(self, "values", DEFAULTS.get(model_type, {}) | self.raw)

    @property
    def model_type(self) -> str:
        return self.raw["model_type"]

    @property
    def family(self) -> str | None:
        """The parameter-formula family, or None for an architecture without formulas."""
        return FAMILIES.get(self.model_type)

    @property
    def architecture(self) -> str:
        """The first of `architectures` (the head transformers instantiates), else the model_type."""
        archs = self.raw.get("architectures")
        return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else self.model_type

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None, *, minimum: int = 1, maximum: int | None = None) -> int:
        """An integer field within [minimum, maximum] (default: the field's bound in limits.py).

        ArtifactError naming the file and field when missing, not an integer or out of bounds.
        """
        value = self.get(key, default)
        if value is None:
            raise ArtifactError(f"{self.source}: field {key!r} is missing")
        maximum = config_int_max(key) if maximum is None else maximum
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise ArtifactError(
                f"{self.source}: field {key!r} must be an integer between {minimum} and {maximum:,}, got {shown(value)}"
            )
        return value

    def positions(self) -> int | None:
        """The token positions the model can attend over (`max_position_embeddings`, GPT-2's `n_positions`,
        the family's default when unset); None when it declares none (T5, vision). ArtifactError when invalid."""
        for key in ("max_position_embeddings", "n_positions"):
            if self.get(key):
                return self.int(key)
        return None

    def int_list(self, key: str, *, minimum: int = 1, allow_empty: bool = False) -> list[int]:
        """A list of integers, each within [minimum, the field's bound], at most MAX_LIST of them."""
        value = self.get(key, [])
        maximum = config_int_max(key)
        if (
            not isinstance(value, list)
            or not (allow_empty or value)
            or len(value) > MAX_LIST
            or not all(isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum for v in value)
        ):
            raise ArtifactError(
                f"{self.source}: field {key!r} must be a list of at most {MAX_LIST:,} integers between {minimum} and "
                f"{maximum:,}, got {shown(value)}"
            )
        return value

    def number(self, key: str, default: float, *, maximum: float = MAX_CONFIG_FLOAT) -> float:
        """A positive finite number (a multiplier or ratio) of at most `maximum`."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= maximum:
            raise ArtifactError(
                f"{self.source}: field {key!r} must be a number above 0 and at most {maximum:g}, got {shown(value)}"
            )
        return float(value)

    def num_labels(self) -> int:
        """Classifier outputs: `id2label` wins over `num_labels`, as in PretrainedConfig (default 2)."""
        id2label = self.raw.get("id2label")
        if isinstance(id2label, dict) and id2label:
            return len(id2label)
        return self.int("num_labels", 2, minimum=0)


def read_config(path: str | Path, roots: Sequence[str | os.PathLike] | None = None) -> ModelConfig:
    """Parse config.json at `path` (inside `roots` when given); ArtifactError naming the file on any defect."""
    path = Path(path)
    return ModelConfig(read_json(path, roots), str(path))
