"""The term-by-term estimate: KV cache, dtype conversion, config-only models and bad input."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from agent.artifacts import ArtifactError, canonical_dtype, dtype_bytes, estimate, inspect_model_dir, read_model_dir
from agent.artifacts.estimate import FALLBACK_MARGIN, OVERHEAD_BYTES

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "max_position_embeddings": 4096}


def write(path: Path, config: dict, tensors: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"))
    return path


def test_it_accepts_torch_names_and_short_forms():
    assert [canonical_dtype(n) for n in ("fp32", "FP16", "bf16", "torch.bfloat16", "float64", "int8")] == [
        "float32", "float16", "bfloat16", "bfloat16", "float64", "int8"]
    assert [dtype_bytes(n) for n in ("float32", "fp16", "bf16", "float64", "int8")] == [4, 2, 2, 8, 1]


def test_it_names_an_unknown_dtype():
    with pytest.raises(ArtifactError, match="dtype 'float13'"):
        canonical_dtype("float13")


def test_it_counts_the_kv_cache_with_grouped_query_attention(tmp_path):
    est = estimate(write(tmp_path / "m", LLAMA), dtype="float16", batch=3, seq=1000)
    # layers x KV heads x head size x (K and V) x bytes x context x batch
    assert est.kv_cache_bytes == 4 * 2 * (64 // 8) * 2 * 2 * 1000 * 3
    assert any("grouped-query" in n for n in est.notes)


def test_it_caps_sliding_window_layers_at_their_window(tmp_path):
    mistral = LLAMA | {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 256}
    est = estimate(write(tmp_path / "m", mistral), dtype="float32", seq=1000)
    assert est.kv_cache_bytes == 4 * 2 * 8 * 2 * 4 * 256
    # Qwen2 ignores the window unless use_sliding_window; then only layers from max_window_layers on
    qwen = LLAMA | {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "sliding_window": 256}
    assert estimate(write(tmp_path / "q", qwen), dtype="float32", seq=1000).kv_cache_bytes == 4 * 2 * 8 * 2 * 4 * 1000
    qwen |= {"use_sliding_window": True, "max_window_layers": 1}
    est = estimate(write(tmp_path / "q2", qwen), dtype="float32", seq=1000)
    assert est.kv_cache_bytes == 2 * 8 * 2 * 4 * (1000 + 3 * 256)
    assert any("sliding window 256" in n for n in est.notes)


def test_a_language_models_logits_copied_to_float32_count_beside_them(tmp_path):
    model = write(tmp_path / "m", LLAMA | {"vocab_size": 50_000})
    half, full = (estimate(model, dtype=d, batch=2, seq=100) for d in ("bfloat16", "float32"))
    # At a big vocabulary the logits are the peak: in the serving dtype, then the float32 copy the worker answers with.
    assert half.activation_bytes == (2 * 200 * 64 + 200 * 50_000) * 2 + 200 * 50_000 * 4
    assert full.activation_bytes == (2 * 200 * 64 + 200 * 50_000) * 4  # already float32: no copy
    assert any("float32" in n for n in half.notes) and not any("copied" in n for n in full.notes)


def test_encoders_and_vision_models_have_no_kv_cache(tmp_path):
    bert = estimate(write(tmp_path / "b", {"model_type": "bert", "architectures": ["BertModel"]}), seq=128)
    vit = estimate(write(tmp_path / "v", {"model_type": "vit", "architectures": ["ViTModel"]}))
    assert bert.kv_cache_bytes == vit.kv_cache_bytes == 0
    assert bert.activation_bytes > 0 and vit.activation_bytes > 0


def test_a_config_only_model_is_estimated_from_its_parameter_count(tmp_path):
    est = estimate(write(tmp_path / "r", {"model_type": "resnet", "architectures": ["ResNetForImageClassification"],
                                          "num_labels": 1000}), dtype="bf16", device="cpu")
    assert est.parameters == 25_557_032  # ResNet-50
    assert est.weights_bytes == (25_557_032 + 53_120) * 2 + 53 * 8  # + BatchNorm running stats, int64 counters
    assert est.overhead_bytes == OVERHEAD_BYTES["cpu"]
    assert est.total_bytes == est.weights_bytes + est.kv_cache_bytes + est.activation_bytes + est.overhead_bytes


def test_header_weights_are_exact_and_converted_to_the_serving_dtype(tmp_path):
    tensors = {"a": np.zeros((10, 8), np.float32), "b": np.zeros(6, np.float16), "ids": np.zeros(4, np.int64)}
    path = write(tmp_path / "m", LLAMA, tensors)
    assert estimate(path).weights_bytes == 320 + 12 + 32
    assert estimate(path).dtype == "float32"  # the dtype most bytes are stored in
    assert estimate(path, dtype="bf16").weights_bytes == (80 + 6) * 2 + 32  # integer tensors stay as stored
    assert any("converted from float32 to bfloat16" in n for n in estimate(path, dtype="bf16").notes)


def test_int8_is_refused_for_a_model_that_cannot_be_served_in_it(tmp_path):
    path = write(tmp_path / "v", {"model_type": "vit", "architectures": ["ViTModel"]})
    with pytest.raises(ArtifactError, match=r"config\.json: model_type 'vit' cannot be served in int8"):
        estimate(path, dtype="int8")


def test_an_unknown_architecture_falls_back_to_header_weights_and_a_margin(tmp_path):
    path = write(tmp_path / "m", {"model_type": "mamba", "architectures": ["MambaForCausalLM"]},
                 {"w": np.zeros((100, 10), np.float32)})
    est = estimate(path, device="cpu")
    assert (est.weights_bytes, est.activation_bytes, est.family) == (4000, int(4000 * FALLBACK_MARGIN), "unknown")
    assert any("no formulas" in n for n in est.notes)


def test_a_bare_safetensors_file_is_estimated_from_its_header(tmp_path):
    save_file({"w": np.zeros((100, 10), np.float16)}, str(tmp_path / "w.safetensors"))
    est = estimate(tmp_path / "w.safetensors")
    assert est.weights_bytes == 2000 and est.notes[0] == "bare safetensors file: no config.json"


def test_the_estimator_reads_what_registration_refuses(tmp_path):
    path = write(tmp_path / "v", {"model_type": "vit", "architectures": ["ViTForImageClassification"]},
                 {"w": np.zeros(4, np.float32)})
    with pytest.raises(ArtifactError, match="not servable yet"):
        inspect_model_dir(path)
    assert read_model_dir(path).servable is False
    assert estimate(path).architecture == "ViTForImageClassification"


def test_it_names_the_file_of_a_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"config\.json: not valid JSON"):
        estimate(tmp_path)


def test_it_names_the_field_that_is_wrong(tmp_path):
    with pytest.raises(ArtifactError, match=r"config\.json: field 'num_hidden_layers' must be an integer"):
        estimate(write(tmp_path / "m", LLAMA | {"num_hidden_layers": "four"}))
    with pytest.raises(ArtifactError, match=r"config\.json: field 'model_type' is missing"):
        estimate(write(tmp_path / "n", {"architectures": ["LlamaForCausalLM"]}))


def test_it_refuses_a_truncated_or_lying_header(tmp_path):
    path = write(tmp_path / "m", LLAMA, {"w": np.zeros(64, np.float32)})
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match=r"model\.safetensors: tensor 'w' data_offsets"):
        estimate(path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1600]}}).encode()
    weights.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with pytest.raises(ArtifactError, match="past the end of the file"):
        estimate(path)


def test_it_refuses_a_missing_shard(tmp_path):
    path = write(tmp_path / "m", LLAMA)
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1-of-2.safetensors"}}))
    with pytest.raises(ArtifactError, match="shard model-1-of-2.safetensors is listed but missing"):
        estimate(path)


def test_it_refuses_a_nonsense_shape(tmp_path):
    with pytest.raises(ArtifactError, match="batch must be at least 1"):
        estimate(write(tmp_path / "m", LLAMA), batch=0)
