"""A Llama directory (config.json, safetensors, a byte-level BPE tokenizer.json) written as one GGUF file, torch-free.

Enough of llama.cpp's converter for the demo and test models (agent.workers.demo_models): llama.cpp's own
tensor names, its rotary layout for the query and key weights, the tokenizer as "gpt2" (byte-level BPE) with its
merges, and the chat template. Weights are written as F32, F16, Q8_0 or Q4_0 (gguf's own quantizers); norms stay
F32, as llama.cpp's converter leaves them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# The file types this writer makes: each weight matrix's type, and the file's general.file_type.
QUANT_TYPES = ("F32", "F16", "Q8_0", "Q4_0")

# Hugging Face's per-layer names, as llama.cpp's.
_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def write_gguf(model_dir: str | Path, target: str | Path, quant: str = "F16") -> Path:
    """Write the Llama in `model_dir` to `target` as GGUF, its weight matrices in `quant` (one of QUANT_TYPES).
    ValueError for a model this writer does not handle (not a Llama, no byte-level BPE tokenizer)."""
    import gguf
    from safetensors.numpy import load_file

    if quant not in QUANT_TYPES:
        raise ValueError(f"quant must be one of {', '.join(QUANT_TYPES)}, not {quant!r}")
    model_dir, target = Path(model_dir), Path(target)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "llama":
        raise ValueError(f"{model_dir} is not a Llama (model_type {config.get('model_type')!r})")
    weights: dict[str, np.ndarray] = {}
    for part in sorted(model_dir.glob("*.safetensors")):
        weights |= load_file(str(part))
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    rope = config.get("rope_parameters") or {}
    rope_theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))

    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(getattr(gguf.LlamaFileType, "ALL_F32" if quant == "F32" else f"MOSTLY_{quant}"))
    if quant.startswith("Q"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_tokenizer(writer, model_dir, config)

    qtype = gguf.GGMLQuantizationType[quant]
    for name, array in _llama_tensors(weights, config, heads, kv_heads):
        array = np.ascontiguousarray(array, dtype=np.float32)
        if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def _llama_tensors(weights: dict[str, np.ndarray], config: dict, heads: int, kv_heads: int):
    """(llama.cpp name, array) for every tensor; q and k permuted to llama.cpp's rotary layout."""
    for hf, name in _TOP_TENSORS.items():
        if hf in weights:
            yield name, weights[hf]
    if "lm_head.weight" not in weights and not config.get("tie_word_embeddings"):
        raise ValueError("the model has no lm_head.weight and does not tie it to its embeddings")
    for layer in range(config["num_hidden_layers"]):
        for hf, name in _LAYER_TENSORS.items():
            array = weights[f"model.layers.{layer}.{hf}"]
            if hf == "self_attn.q_proj.weight":
                array = _permute(array, heads)
            elif hf == "self_attn.k_proj.weight":
                array = _permute(array, kv_heads)
            yield f"blk.{layer}.{name}", array


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    # Hugging Face rotates the two halves of each head; llama.cpp rotates interleaved pairs.
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _add_tokenizer(writer, model_dir: Path, config: dict) -> None:
    import gguf

    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE" or (tokenizer.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise ValueError(f"{model_dir}'s tokenizer is not a byte-level BPE")
    by_id = {i: t for t, i in model["vocab"].items()}
    special = {t["id"]: t["content"] for t in tokenizer.get("added_tokens", ())}
    by_id |= special
    tokens, types = [], []
    for i in range(config["vocab_size"]):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:  # ids the trained vocabulary left free
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model.get("merges", ())])
    settings = _read_json(model_dir / "tokenizer_config.json")
    ids = {t: i for i, t in by_id.items()}
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        token = settings.get(f"{role}_token")
        if isinstance(token, str) and token in ids:
            add(ids[token])
    writer.add_add_bos_token(True)  # as its tokenizer's post-processor does
    if isinstance(settings.get("chat_template"), str):
        writer.add_chat_template(settings["chat_template"])


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
