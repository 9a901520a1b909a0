"""Parameter counts from config.json alone, by the formulas of each architecture family.

Each formula mirrors the modules transformers 5 instantiates for the config's first
`architectures` entry (the head), so the count equals `sum(p.numel() for p in model.parameters())`
(tied weights counted once). Persistent buffers that land in the checkpoint (BatchNorm running
statistics) are counted separately: they cost weight memory but are not parameters.
Heads without a formula here count the base model only and say so in `notes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.artifacts.config import ModelConfig
from agent.artifacts.errors import ArtifactError


@dataclass
class ParameterCount:
    """Parameters, checkpoint buffers (float and int64 elements) and what the count left out."""

    parameters: int = 0
    float_buffers: int = 0
    int64_buffers: int = 0
    notes: list[str] = field(default_factory=list)


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _head_note(cfg: ModelConfig, counted: str) -> str:
    return f"head {cfg.architecture!r} has no formula: counted {counted} only"


def count_parameters(cfg: ModelConfig) -> ParameterCount:
    """Count what the config's architecture instantiates; ArtifactError for a family without formulas."""
    counters = {
        "llama": _decoder, "moe": _decoder, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "bert": _bert,
        "distilbert": _distilbert, "t5": _t5, "vit": _vit, "resnet": _resnet, "mobilenet_v2": _mobilenet_v2,
    }
    if cfg.family not in counters:
        raise ArtifactError(f"{cfg.source}: model_type {cfg.model_type!r} has no parameter formula")
    return counters[cfg.family](cfg)


# --- decoders -----------------------------------------------------------------------------------


def head_dim(cfg: ModelConfig) -> int:
    """Per-head size: an explicit `head_dim` (Gemma, Mistral) wins over hidden / heads."""
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    return cfg.int("head_dim", hidden // heads)


def kv_heads(cfg: ModelConfig) -> int:
    """Grouped-query attention: fewer KV heads than query heads; absent means multi-head (equal)."""
    return cfg.int("num_key_value_heads", cfg.int("num_attention_heads"))


def _sparse_layers(cfg: ModelConfig, layers: int) -> int:
    """How many of the decoder layers hold experts, counted without walking the layers."""
    if cfg.family != "moe":
        return 0
    if cfg.model_type == "mixtral":
        return layers
    # Qwen2-MoE: layer i is sparse when (i + 1) is a multiple of decoder_sparse_step and i is not
    # listed in mlp_only_layers; layers // step of them are on that grid.
    step = cfg.int("decoder_sparse_step", 1)
    listed = cfg.int_list("mlp_only_layers", minimum=0, allow_empty=True)
    dense = {i for i in listed if i < layers and (i + 1) % step == 0}
    return layers // step - len(dense)


def _decoder(cfg: ModelConfig) -> ParameterCount:
    """Llama, Mistral, Qwen2, Gemma, Mixtral and Qwen2-MoE: RMSNorm, rotary (no position table), gated MLP."""
    hidden, vocab, layers = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    heads, kv, hd = cfg.int("num_attention_heads"), kv_heads(cfg), head_dim(cfg)
    inter = cfg.int("intermediate_size")
    mt = cfg.model_type
    # Qwen2 always has q/k/v biases; Qwen2-MoE has them when qkv_bias; Llama/Gemma when attention_bias.
    qkv_bias = True if mt == "qwen2" else bool(cfg.get("qkv_bias")) if mt == "qwen2_moe" else bool(
        cfg.get("attention_bias")
    )
    o_bias = bool(cfg.get("attention_bias")) and mt in ("llama", "gemma")
    mlp_bias = bool(cfg.get("mlp_bias")) and mt == "llama"
    attn = (_linear(hidden, heads * hd, qkv_bias) + 2 * _linear(hidden, kv * hd, qkv_bias)
            + _linear(heads * hd, hidden, o_bias))
    dense_mlp = 2 * _linear(hidden, inter, mlp_bias) + _linear(inter, hidden, mlp_bias)
    # closed form: every layer has the same attention and norms; `sparse` of them an MoE block instead
    # of the dense MLP (never a loop over a layer count read from the file)
    sparse = _sparse_layers(cfg, layers)
    total = vocab * hidden + hidden  # embeddings + final norm
    total += layers * (attn + 2 * hidden)  # attention + input and post-attention norms
    total += (layers - sparse) * dense_mlp + (sparse * _moe_mlp(cfg, hidden) if sparse else 0)
    count = ParameterCount(total)
    _add_lm_head(cfg, count, vocab * hidden)
    return count


def _moe_mlp(cfg: ModelConfig, hidden: int) -> int:
    if cfg.model_type == "mixtral":
        experts, inter = cfg.int("num_local_experts"), cfg.int("intermediate_size")
        return hidden * experts + experts * 3 * hidden * inter  # router + gate/up/down per expert
    experts, inter = cfg.int("num_experts"), cfg.int("moe_intermediate_size")
    shared = cfg.int("shared_expert_intermediate_size", minimum=0)
    # router, routed experts, the always-on shared expert and its scalar gate
    return hidden * experts + experts * 3 * hidden * inter + 3 * hidden * shared + hidden


def _add_lm_head(cfg: ModelConfig, count: ParameterCount, embedding: int) -> None:
    arch = cfg.architecture
    if arch.endswith(("ForCausalLM", "LMHeadModel")):
        if not cfg.get("tie_word_embeddings", False):
            count.parameters += embedding  # an untied lm_head; tied shares the embedding matrix
    elif not arch.endswith("Model") or arch.endswith("PreTrainedModel"):
        count.notes.append(_head_note(cfg, "the base model"))


def _gpt2(cfg: ModelConfig) -> ParameterCount:
    """GPT-2: learned positions, LayerNorm with bias, Conv1D projections with bias, tied head by default."""
    hidden, vocab, layers = cfg.int("n_embd"), cfg.int("vocab_size"), cfg.int("n_layer")
    inner = cfg.int("n_inner", 4 * hidden)
    block = 2 * hidden + _linear(hidden, 3 * hidden) + _linear(hidden, hidden) + 2 * hidden
    block += _linear(hidden, inner) + _linear(inner, hidden)
    count = ParameterCount(vocab * hidden + cfg.int("n_positions") * hidden + layers * block + 2 * hidden)
    _add_lm_head(cfg, count, vocab * hidden)
    return count


def _gpt_neox(cfg: ModelConfig) -> ParameterCount:
    """GPT-NeoX: fused QKV, two LayerNorms per block (parallel residual), rotary, untied `embed_out`."""
    hidden, vocab, layers = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    inter, bias = cfg.int("intermediate_size"), bool(cfg.get("attention_bias", True))
    block = 4 * hidden + _linear(hidden, 3 * hidden, bias) + _linear(hidden, hidden, bias)
    block += _linear(hidden, inter) + _linear(inter, hidden)
    count = ParameterCount(vocab * hidden + layers * block + 2 * hidden)
    _add_lm_head(cfg, count, vocab * hidden)
    return count


# --- encoders -----------------------------------------------------------------------------------


def _bert(cfg: ModelConfig) -> ParameterCount:
    """BERT/RoBERTa: word + position + token-type embeddings, post-LN blocks; head decides the pooler.

    `*Model` (what AutoModel builds) has the pooler (dense h->h); `*ForMaskedLM` drops it and adds
    the MLM transform (dense + LayerNorm) and a decoder bias, its decoder weight tied to the embeddings.
    """
    hidden, vocab, layers = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    inter = cfg.int("intermediate_size")
    emb = (vocab + cfg.int("max_position_embeddings") + cfg.int("type_vocab_size", minimum=0)) * hidden + 2 * hidden
    block = 4 * _linear(hidden, hidden) + 2 * hidden + _linear(hidden, inter) + _linear(inter, hidden) + 2 * hidden
    count = ParameterCount(emb + layers * block)
    arch, labels = cfg.architecture, cfg.num_labels()
    if arch.endswith("ForMaskedLM"):
        count.parameters += _linear(hidden, hidden) + 2 * hidden + vocab
        if not cfg.get("tie_word_embeddings", True):
            count.parameters += vocab * hidden
    elif arch.endswith("ForSequenceClassification") and cfg.model_type == "bert":
        count.parameters += _linear(hidden, hidden) + _linear(hidden, labels)  # pooler + classifier
    elif arch.endswith("ForSequenceClassification"):
        count.parameters += _linear(hidden, hidden) + _linear(hidden, labels)  # RoBERTa head: dense + out_proj
    else:
        count.parameters += _linear(hidden, hidden)  # the pooler of BertModel/RobertaModel
        if not arch.endswith("Model"):
            count.notes.append(_head_note(cfg, "the base model with its pooler"))
    return count


def _distilbert(cfg: ModelConfig) -> ParameterCount:
    """DistilBERT: no token types, no pooler; MaskedLM adds transform + LayerNorm + tied projector bias."""
    dim, vocab, layers, hidden = cfg.int("dim"), cfg.int("vocab_size"), cfg.int("n_layers"), cfg.int("hidden_dim")
    emb = (vocab + cfg.int("max_position_embeddings")) * dim + 2 * dim
    block = 4 * _linear(dim, dim) + 2 * dim + _linear(dim, hidden) + _linear(hidden, dim) + 2 * dim
    count = ParameterCount(emb + layers * block)
    arch = cfg.architecture
    if arch.endswith("ForMaskedLM"):
        count.parameters += _linear(dim, dim) + 2 * dim + vocab
        if not cfg.get("tie_word_embeddings", True):
            count.parameters += vocab * dim
    elif arch.endswith("ForSequenceClassification"):
        count.parameters += _linear(dim, dim) + _linear(dim, cfg.num_labels())  # pre_classifier + classifier
    elif not arch.endswith("Model"):
        count.notes.append(_head_note(cfg, "the base model"))
    return count


def _t5(cfg: ModelConfig) -> ParameterCount:
    """T5: shared embedding, no biases, RMS LayerNorm, relative attention bias in each stack's first block."""
    d, vocab, dkv, heads, dff = (cfg.int(k) for k in ("d_model", "vocab_size", "d_kv", "num_heads", "d_ff"))
    enc_layers = cfg.int("num_layers")
    dec_layers = cfg.int("num_decoder_layers", enc_layers)
    gated = str(cfg.get("feed_forward_proj", "relu")).startswith("gated-")
    attn = 4 * d * heads * dkv
    ff = (3 if gated else 2) * d * dff + d  # wi (or wi_0 + wi_1), wo, and the layer's norm
    rel_bias = cfg.int("relative_attention_num_buckets") * heads
    encoder = enc_layers * (attn + d + ff) + rel_bias + d
    decoder = dec_layers * (2 * attn + 2 * d + ff) + rel_bias + d
    arch = cfg.architecture
    count = ParameterCount(vocab * d + encoder)
    if arch == "T5EncoderModel":
        return count
    count.parameters += decoder
    if arch == "T5ForConditionalGeneration":
        if not cfg.get("tie_word_embeddings", True):
            count.parameters += vocab * d
    elif arch != "T5Model":
        count.notes.append(_head_note(cfg, "the encoder-decoder without an LM head"))
    return count


# --- vision -------------------------------------------------------------------------------------


def _vit(cfg: ModelConfig) -> ParameterCount:
    """ViT: patch conv, CLS token, position table; ViTModel adds a pooler, the classifier head drops it."""
    hidden, layers, inter = cfg.int("hidden_size"), cfg.int("num_hidden_layers"), cfg.int("intermediate_size")
    image, patch, channels = cfg.int("image_size"), cfg.int("patch_size"), cfg.int("num_channels")
    patches = (image // patch) ** 2
    emb = hidden + (patches + 1) * hidden + channels * patch * patch * hidden + hidden
    block = 3 * _linear(hidden, hidden, bool(cfg.get("qkv_bias", True))) + _linear(hidden, hidden)
    block += 4 * hidden + _linear(hidden, inter) + _linear(inter, hidden)
    count = ParameterCount(emb + layers * block + 2 * hidden)
    arch = cfg.architecture
    if arch == "ViTForImageClassification":
        labels = cfg.num_labels()
        count.parameters += _linear(hidden, labels) if labels > 0 else 0
    else:
        count.parameters += _linear(hidden, hidden)  # ViTModel's default pooler (dense + tanh)
        if arch != "ViTModel":
            count.notes.append(_head_note(cfg, "the base model with its pooler"))
    return count


def _conv_bn(count: ParameterCount, c_in: int, c_out: int, kernel: int, groups: int = 1, times: int = 1) -> None:
    """`times` bias-free convs, each with its BatchNorm: weight+bias are parameters, running stats buffers."""
    count.parameters += times * (c_out * (c_in // groups) * kernel * kernel + 2 * c_out)
    count.float_buffers += times * 2 * c_out
    count.int64_buffers += times  # num_batches_tracked


def _classifier(cfg: ModelConfig, count: ParameterCount, features: int, suffix: str) -> None:
    arch = cfg.architecture
    if arch.endswith("ForImageClassification"):
        labels = cfg.num_labels()
        count.parameters += _linear(features, labels) if labels > 0 else 0
    elif not arch.endswith(suffix):
        count.notes.append(_head_note(cfg, "the base model"))


def _resnet(cfg: ModelConfig) -> ParameterCount:
    """transformers' ResNet: 7x7 stem, basic or bottleneck (reduction 4) stages, 1x1 projection shortcuts."""
    count = ParameterCount()
    _conv_bn(count, cfg.int("num_channels"), cfg.int("embedding_size"), 7)
    sizes, depths = cfg.int_list("hidden_sizes"), cfg.int_list("depths")
    bottleneck = cfg.get("layer_type", "bottleneck") == "bottleneck"
    first_stride = 2 if cfg.get("downsample_in_first_stage") else 1
    c_in = cfg.int("embedding_size")
    for stage, (c_out, depth) in enumerate(zip(sizes, depths, strict=False)):
        # the stage's first block changes width or stride; the other depth - 1 blocks are identical
        stride = first_stride if stage == 0 else 2
        if c_in != c_out or stride != 1:
            _conv_bn(count, c_in, c_out, 1)  # projection shortcut
        for block_in, times in ((c_in, 1), (c_out, depth - 1)):
            if bottleneck:
                reduced = c_out // 4
                _conv_bn(count, block_in, reduced, 1, times=times)
                _conv_bn(count, reduced, reduced, 3, times=times)
                _conv_bn(count, reduced, c_out, 1, times=times)
            else:
                _conv_bn(count, block_in, c_out, 3, times=times)
                _conv_bn(count, c_out, c_out, 3, times=times)
        c_in = c_out
    _classifier(cfg, count, sizes[-1], "ResNetModel")
    return count


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """MobileNet's channel rounding (same as transformers): nearest multiple, never 10% below `value`."""
    min_value = divisor if min_value is None else min_value
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    return int(new_value + divisor if new_value < 0.9 * value else new_value)


MOBILENET_V2_CHANNELS = (16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 160, 160, 160, 320)


def mobilenet_v2_channels(cfg: ModelConfig) -> tuple[list[int], int, int]:
    """(block channels after the depth multiplier, stem width, final 1x1 width)."""
    mult, div, min_depth = cfg.number("depth_multiplier", 1.0), cfg.int("depth_divisible_by"), cfg.int("min_depth")

    def scale(c: int) -> int:
        return make_divisible(int(round(c * mult)), div, min_depth)

    last = 1280 if cfg.get("finegrained_output", True) and mult < 1.0 else scale(1280)
    return [scale(c) for c in MOBILENET_V2_CHANNELS], scale(32), last


def _mobilenet_v2(cfg: ModelConfig) -> ParameterCount:
    """transformers' MobileNetV2: stem, 16 inverted residual blocks (expand, depthwise, reduce), 1x1 head conv."""
    count = ParameterCount()
    channels, stem, last = mobilenet_v2_channels(cfg)
    div, min_depth, ratio = cfg.int("depth_divisible_by"), cfg.int("min_depth"), cfg.number("expand_ratio", 6.0)
    _conv_bn(count, cfg.int("num_channels"), stem, 3)
    if not cfg.get("first_layer_is_expansion", True):
        _conv_bn(count, stem, stem, 1)
    _conv_bn(count, stem, stem, 3, groups=stem)
    _conv_bn(count, stem, channels[0], 1)
    for i in range(16):
        expanded = make_divisible(int(round(channels[i] * ratio)), div, min_depth)
        _conv_bn(count, channels[i], expanded, 1)
        _conv_bn(count, expanded, expanded, 3, groups=expanded)
        _conv_bn(count, expanded, channels[i + 1], 1)
    _conv_bn(count, channels[-1], last, 1)
    _classifier(cfg, count, last, "MobileNetV2Model")
    return count
