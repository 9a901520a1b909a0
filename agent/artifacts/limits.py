"""Every bound ModelGrid puts on what an artifact file may declare, in one place.

Artifacts come from operators' disks and the Hub, so their numbers are untrusted: a config with
`num_hidden_layers: 10**15`, a header with a 5,000-digit integer or a 2**60-element shape must be
refused up front, with the file and field named, instead of reaching arithmetic, loops or the
database. The bounds sit far above real models (the largest published ones have ~130 layers,
hidden sizes ~2**14, vocabularies ~2**18, ~2**23 positions and a few hundred experts), so they
only ever refuse a file that is broken or hostile.
"""

from __future__ import annotations

# --- files --------------------------------------------------------------------------------------
MAX_JSON_BYTES = 16 * 1024 * 1024  # config.json, adapter_config.json, model.safetensors.index.json
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the safetensors format's own header limit
MAX_JSON_DEPTH = 64  # nesting of any artifact JSON; real configs nest 3 or 4 levels
MAX_INT_DIGITS = 20  # an int64 has 19 digits; longer is refused before int() ever parses it
MAX_DIR_ENTRIES = 10_000  # files and directories checked in one model or adapter directory; real ones hold ~10-300
MAX_DIR_DEPTH = 8  # directory levels walked below a model directory; real ones nest one or two

# --- config.json integers -----------------------------------------------------------------------
MAX_LAYERS = 1024
MAX_HIDDEN = 2**20  # hidden, intermediate and expert widths, per-head sizes, channels
MAX_HEADS = 2**16
MAX_VOCAB = 2**24
MAX_POSITIONS = 2**24  # positions, windows, sequence lengths a config declares
MAX_EXPERTS = 2**14
MAX_IMAGE = 2**16  # image side and patch size, in pixels
MAX_LABELS = 2**24
MAX_LIST = 1024  # entries of a list field (ResNet depths/hidden_sizes, mlp_only_layers, layer_types)
MAX_CONFIG_INT = 2**31 - 1  # any other integer field
MAX_CONFIG_FLOAT = 1024.0  # multipliers and ratios (MobileNet depth_multiplier, expand_ratio)

_FIELD_GROUPS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (MAX_LAYERS, ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers",
                  "max_window_layers", "decoder_sparse_step", "depths", "mlp_only_layers")),
    (MAX_HIDDEN, ("hidden_size", "n_embd", "dim", "d_model", "intermediate_size", "n_inner", "hidden_dim", "d_ff",
                  "moe_intermediate_size", "shared_expert_intermediate_size", "head_dim", "d_kv",
                  "embedding_size", "hidden_sizes", "num_channels", "depth_divisible_by", "min_depth")),
    (MAX_HEADS, ("num_attention_heads", "num_key_value_heads", "n_head", "n_heads", "num_heads",
                 "relative_attention_num_buckets")),
    (MAX_VOCAB, ("vocab_size", "type_vocab_size")),
    (MAX_POSITIONS, ("max_position_embeddings", "n_positions", "sliding_window")),
    (MAX_EXPERTS, ("num_experts", "num_local_experts", "num_experts_per_tok")),
    (MAX_IMAGE, ("image_size", "patch_size", "output_stride")),
    (MAX_LABELS, ("num_labels",)),
)
CONFIG_INT_MAX: dict[str, int] = {name: bound for bound, names in _FIELD_GROUPS for name in names}

# --- config.json numbers the worker computes with -------------------------------------------------
# float32 overflows at ~3.4e38 (rope_theta 1e308 became inf in the rotary frequencies and killed the
# worker); real configs hold no float above ~4e9, so anything past this is refused, whatever its key.
MAX_CONFIG_MAGNITUDE = 1e15
ROPE_THETA_RANGE = (1.0, 1e12)  # real rotary bases run from 1e4 to ~3.6e9 (Llama-3 Gradient 1M)
EPSILON_MAX = 1.0  # norm epsilons, above 0 (a zero vector would divide by zero); real ones are 1e-12..1e-5
ROPE_FACTOR_MAX = 1024.0  # rope scaling factors, above 0 (positions are divided by them); real ones reach ~128
MAX_ROPE_NUMBER = float(MAX_POSITIONS)  # any other number of rope_scaling / rope_parameters (lengths, betas)

# --- safetensors headers ------------------------------------------------------------------------
MAX_RANK = 8  # dimensions of one tensor
MAX_DIM = 2**40  # one dimension
MAX_NUMEL = 2**48  # elements of one tensor (~281 trillion)
MAX_TENSOR_NAME = 1024  # characters of a tensor name; real ones have ~50 to ~150

# --- LoRA adapters ------------------------------------------------------------------------------
MAX_LORA_RANK = 2**14  # r and rank_pattern values; real adapters use 4..1024
MAX_PATTERNS = 4096  # keys of rank_pattern / alpha_pattern
MAX_PATTERN_CHARS = 1024  # one pattern (a key, or target_modules as a string)
MAX_REPEAT_PRODUCT = 10_000  # product of a pattern's counted repeats ({m}, {m,n}): `regex` expands them
PATTERN_MATCH_SECONDS = 0.1  # one regular-expression match
PATTERN_TOTAL_SECONDS = 2.0  # all matches of one adapter config together

# --- estimates ----------------------------------------------------------------------------------
MAX_ESTIMATE_BYTES = 2**60  # 1 EiB: no term of an estimate may exceed it (the database holds int64)


def config_int_max(key: str) -> int:
    """The largest value config.json field `key` may hold."""
    return CONFIG_INT_MAX.get(key, MAX_CONFIG_INT)
