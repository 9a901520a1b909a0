"""The transient terms of one replica's memory: KV cache and activation peak, from the config.

All sizes are in elements times the compute dtype's bytes; nothing here reads weights.
The activation model follows how transformers' eager modules hold tensors during one forward:
the residual stream stays alive while one sub-block (attention, MLP, LM head) allocates its
temporaries, so the peak is the residual plus the largest sub-block, not their sum.
"""

from __future__ import annotations

from agent.artifacts.config import ModelConfig
from agent.artifacts.params import head_dim, kv_heads, make_divisible, mobilenet_v2_channels


def default_seq(cfg: ModelConfig) -> int:
    """The declared shape when none is given: min(max positions, 2048) tokens; the image side for vision."""
    if cfg.family in ("vit", "resnet", "mobilenet_v2"):
        return cfg.int("image_size", 224)
    positions = cfg.positions()
    # T5 has relative positions and no limit; 512 is its pre-training length
    return 512 if positions is None else min(positions, 2048)


def sliding_windows(cfg: ModelConfig) -> tuple[int | None, int, int]:
    """(window, layers capped at it, layers with full attention), as transformers 5 assigns windows.

    Counted, never listed per layer: the number of layers comes from the file.
    """
    layers = cfg.int("num_hidden_layers")
    window = cfg.int("sliding_window") if cfg.get("sliding_window") else None
    if cfg.model_type in ("qwen2", "qwen2_moe") and not cfg.get("use_sliding_window", False):
        window = None  # Qwen2 ignores sliding_window unless use_sliding_window is set
    if window is None:
        return None, 0, layers
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        windowed = types.count("sliding_attention")
    elif cfg.model_type in ("qwen2", "qwen2_moe"):
        windowed = max(0, layers - cfg.int("max_window_layers", minimum=0))  # layers from max_window_layers on
    else:
        windowed = layers
    return window, windowed, layers - windowed


def kv_cache_elements(cfg: ModelConfig, batch: int, context: int) -> tuple[int, list[str]]:
    """K and V elements for `batch` sequences of `context` tokens; 0 for encoders and vision models."""
    notes: list[str] = []
    if cfg.family in ("llama", "moe"):
        per_token = kv_heads(cfg) * head_dim(cfg) * 2
        window, windowed, full = sliding_windows(cfg)
        tokens = full * context + (windowed * min(context, window) if window is not None else 0)
        if window is not None and windowed and window < context:
            notes.append(f"sliding window {window} caps the KV cache of {windowed} of {windowed + full} layers")
        if kv_heads(cfg) < cfg.int("num_attention_heads"):
            notes.append(f"grouped-query attention: {kv_heads(cfg)} KV heads for "
                         f"{cfg.int('num_attention_heads')} query heads")
        return per_token * tokens * batch, notes
    if cfg.family == "gpt2":
        return cfg.int("n_layer") * cfg.int("n_embd") * 2 * context * batch, notes
    if cfg.family == "gpt_neox":
        return cfg.int("num_hidden_layers") * cfg.int("hidden_size") * 2 * context * batch, notes
    if cfg.family == "t5" and cfg.architecture != "T5EncoderModel":
        layers = cfg.int("num_decoder_layers", cfg.int("num_layers"))
        # decoder self-attention over `context` targets plus cross-attention over `context` encoder tokens
        notes.append("T5 KV cache: decoder self-attention and cross-attention, both at the declared length")
        return layers * cfg.int("num_heads") * cfg.int("d_kv") * 2 * 2 * context * batch, notes
    return 0, notes


def activation_elements(cfg: ModelConfig, batch: int, seq: int, *, fused_attention: bool = True) -> int:
    """Peak transient elements of one inference forward at (batch, seq) (image side for vision)."""
    family = cfg.family
    if family == "resnet":
        return _resnet_peak(cfg, batch, seq)
    if family == "mobilenet_v2":
        return _mobilenet_peak(cfg, batch, seq)
    tokens = batch * seq
    if family in ("llama", "moe"):
        hidden, heads, kv, hd = cfg.int("hidden_size"), cfg.int("num_attention_heads"), kv_heads(cfg), head_dim(cfg)
        inter = cfg.int("intermediate_size")
        if family == "moe":
            # routed experts run one after another on their tokens: at most all tokens through one expert,
            # plus the running output sum; Qwen2-MoE's shared expert runs on every token
            expert = cfg.int("moe_intermediate_size", inter) if cfg.model_type == "qwen2_moe" else inter
            shared = cfg.int("shared_expert_intermediate_size", 0, minimum=0)
            mlp = 3 * tokens * max(expert, shared) + tokens * hidden
        else:
            mlp = 3 * tokens * inter  # gate, act(gate), up (and their product replaces one)
        attn = tokens * (heads + 2 * kv) * hd + tokens * heads * hd + _scores(batch, heads, seq, fused_attention)
        logits = tokens * cfg.int("vocab_size") if cfg.architecture.endswith("ForCausalLM") else 0
        return 2 * tokens * hidden + max(attn, mlp, logits)
    if family in ("gpt2", "gpt_neox", "bert", "distilbert", "vit"):
        hidden, heads, inter, vocab = _dense_dims(cfg)
        if family == "vit":
            patches = (cfg.int("image_size") // cfg.int("patch_size")) ** 2
            tokens = batch * (patches + 1)
            seq = patches + 1
        attn = 4 * tokens * hidden + _scores(batch, heads, seq, fused_attention)
        mlp = 2 * tokens * inter  # fc output and its activation
        lm = cfg.architecture.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM"))
        logits = tokens * vocab if lm else 0
        pixels = batch * cfg.int("num_channels") * cfg.int("image_size") ** 2 if family == "vit" else 0
        return pixels + 2 * tokens * hidden + max(attn, mlp, logits)
    if family == "t5":
        d, heads, dkv, dff = cfg.int("d_model"), cfg.int("num_heads"), cfg.int("d_kv"), cfg.int("d_ff")
        gated = str(cfg.get("feed_forward_proj", "relu")).startswith("gated-")
        # T5 adds a relative position bias to the scores, so attention is never fused: the bias,
        # the scores and their softmax are all materialised
        attn = 4 * tokens * heads * dkv + heads * seq * seq + 2 * batch * heads * seq * seq
        mlp = (3 if gated else 2) * tokens * dff
        logits = tokens * cfg.int("vocab_size") if cfg.architecture == "T5ForConditionalGeneration" else 0
        # the encoder output stays alive for the decoder's cross-attention
        return 3 * tokens * d + max(attn, mlp, logits)
    return 0


def logits_elements(cfg: ModelConfig, batch: int, seq: int) -> int:
    """Elements of a language model's logits over every position of (batch, seq); 0 for other models."""
    if cfg.family in ("llama", "moe") and cfg.architecture.endswith("ForCausalLM"):
        return batch * seq * cfg.int("vocab_size")
    if cfg.family in ("gpt2", "gpt_neox") and cfg.architecture.endswith(("ForCausalLM", "LMHeadModel")):
        return batch * seq * _dense_dims(cfg)[3]
    return 0


def _scores(batch: int, heads: int, seq: int, fused: bool) -> int:
    """Attention scores and their softmax, unless a fused kernel (SDPA/flash) never materialises them."""
    return 0 if fused else 2 * batch * heads * seq * seq


def _dense_dims(cfg: ModelConfig) -> tuple[int, int, int, int]:
    if cfg.family == "gpt2":
        return cfg.int("n_embd"), cfg.int("n_head"), cfg.int("n_inner", 4 * cfg.int("n_embd")), cfg.int("vocab_size")
    if cfg.family == "distilbert":
        return cfg.int("dim"), cfg.int("n_heads"), cfg.int("hidden_dim"), cfg.int("vocab_size")
    vocab = cfg.int("vocab_size", 0, minimum=0)
    return cfg.int("hidden_size"), cfg.int("num_attention_heads"), cfg.int("intermediate_size"), vocab


def _down(side: int, stride: int) -> int:
    """Output side of a padded conv or pool (padding kernel//2), as in ResNet and MobileNetV2."""
    return (side - 1) // stride + 1


def _resnet_peak(cfg: ModelConfig, batch: int, side: int) -> int:
    """Walk the feature maps: inside a block the block input stays alive (residual) while each conv's
    output and its BatchNorm output coexist; at the block's end input, shortcut and output coexist."""
    channels = cfg.int("num_channels")
    emb = cfg.int("embedding_size")
    image = channels * side * side
    s = _down(side, 2)
    peak = image + 2 * emb * s * s  # stem conv output and its BatchNorm output, the image still held
    s2 = _down(s, 2)
    peak = max(peak, emb * s * s + emb * s2 * s2)  # max pool
    s, c_in = s2, emb
    bottleneck = cfg.get("layer_type", "bottleneck") == "bottleneck"
    first_stride = 2 if cfg.get("downsample_in_first_stage") else 1
    for stage, (c_out, depth) in enumerate(zip(cfg.int_list("hidden_sizes"), cfg.int_list("depths"), strict=False)):
        # blocks after a stage's first see the same shapes (c_out in and out, stride 1), so the
        # second block's peak is theirs: walk at most two blocks per stage, whatever the depth
        for i in range(min(depth, 2)):
            stride = (first_stride if stage == 0 else 2) if i == 0 else 1
            block_in = c_in * s * s
            out_s = _down(s, stride)
            if bottleneck:
                red = c_out // 4
                maps = [red * s * s, red * out_s * out_s, c_out * out_s * out_s]
            else:
                maps = [c_out * out_s * out_s, c_out * out_s * out_s]
            prev = block_in
            for m in maps:
                peak = max(peak, block_in + (prev if prev is not block_in else 0) + 2 * m)
                prev = m
            shortcut = c_out * out_s * out_s if (c_in != c_out or stride != 1) else 0
            peak = max(peak, block_in + shortcut + 2 * c_out * out_s * out_s)
            c_in, s = c_out, out_s
    return batch * peak


def _mobilenet_peak(cfg: ModelConfig, batch: int, side: int) -> int:
    """Same walk for MobileNetV2: the expanded (6x) depthwise maps dominate the early blocks."""
    channels, stem, last = mobilenet_v2_channels(cfg)
    div, min_depth, ratio = cfg.int("depth_divisible_by"), cfg.int("min_depth"), cfg.number("expand_ratio", 6.0)
    image = cfg.int("num_channels") * side * side
    s = _down(side, 2)
    peak = image + 2 * stem * s * s
    peak = max(peak, 3 * stem * s * s + channels[0] * s * s)
    strides = (2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1)
    current, target = 2, cfg.int("output_stride")
    for i in range(16):
        stride = 1 if current == target else strides[i]
        current *= stride
        expanded = make_divisible(int(round(channels[i] * ratio)), div, min_depth)
        block_in = channels[i] * s * s
        out_s = _down(s, stride)
        peak = max(peak, block_in + 2 * expanded * s * s, block_in + expanded * s * s + 2 * expanded * out_s * out_s,
                   block_in + expanded * out_s * out_s + 3 * channels[i + 1] * out_s * out_s)
        s = out_s
    return batch * max(peak, channels[-1] * s * s + 2 * last * s * s)
