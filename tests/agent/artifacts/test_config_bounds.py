"""Every number read from config.json is bounded, and counting is closed-form, never a loop over a count.

Before the fix `num_hidden_layers: 10**15` pinned a core forever (params.py looped over the layers).
"""

import json
from pathlib import Path

import pytest

from agent.artifacts import ArtifactError, estimate
from agent.artifacts.config import ModelConfig
from agent.artifacts.limits import MAX_ESTIMATE_BYTES, MAX_HIDDEN, MAX_LAYERS, MAX_LIST, MAX_POSITIONS, MAX_VOCAB
from agent.artifacts.params import count_parameters
from tests.agent.artifacts.isolated import outcome

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "max_position_embeddings": 4096}
QWEN_MOE = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 100,
            "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_experts": 4, "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 24}
RESNET = {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "embedding_size": 16,
          "hidden_sizes": [16, 32, 64], "depths": [1, 3, 5]}
VIT = {"model_type": "vit", "architectures": ["ViTModel"], "hidden_size": 32, "intermediate_size": 48,
       "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 32, "patch_size": 8}
MOBILENET = {"model_type": "mobilenet_v2", "architectures": ["MobileNetV2Model"]}


def write(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (LLAMA | {"num_hidden_layers": 10**15}, "num_hidden_layers"),
        (RESNET | {"depths": [1, 10**15, 1]}, "depths"),
        (QWEN_MOE | {"num_hidden_layers": 10**15, "decoder_sparse_step": 1}, "num_hidden_layers"),
    ],
)
def test_a_count_of_10_to_the_15_is_refused_at_once_instead_of_counted(tmp_path, config, field):
    result = outcome("agent.artifacts.estimate", write(tmp_path / "m", config), timeout=60)
    assert result.startswith("ArtifactError:"), result
    assert f"config.json: field '{field}' must be" in result


ANY = r"[\d,]+"


@pytest.mark.parametrize(
    ("config", "field", "bound"),
    [
        (LLAMA | {"num_hidden_layers": MAX_LAYERS + 1}, "num_hidden_layers", f"{MAX_LAYERS:,}"),
        (LLAMA | {"vocab_size": MAX_VOCAB + 1}, "vocab_size", f"{MAX_VOCAB:,}"),
        (LLAMA | {"hidden_size": MAX_HIDDEN + 1}, "hidden_size", f"{MAX_HIDDEN:,}"),
        (LLAMA | {"intermediate_size": MAX_HIDDEN + 1}, "intermediate_size", f"{MAX_HIDDEN:,}"),
        (LLAMA | {"max_position_embeddings": MAX_POSITIONS + 1}, "max_position_embeddings", f"{MAX_POSITIONS:,}"),
        (LLAMA | {"sliding_window": MAX_POSITIONS + 1}, "sliding_window", f"{MAX_POSITIONS:,}"),
        (LLAMA | {"num_attention_heads": 0}, "num_attention_heads", ANY),
        (QWEN_MOE | {"num_experts": 2**20}, "num_experts", ANY),
        (VIT | {"image_size": 2**20}, "image_size", ANY),
    ],
)
def test_an_integer_field_beyond_its_bound_is_refused_with_the_bound(tmp_path, config, field, bound):
    message = rf"config\.json: field '{field}' must be an integer between \d+ and {bound},"
    with pytest.raises(ArtifactError, match=message):
        estimate(write(tmp_path / "m", config))


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (RESNET | {"hidden_sizes": [16] * (MAX_LIST + 1), "depths": [1] * (MAX_LIST + 1)}, "hidden_sizes"),
        (RESNET | {"depths": []}, "depths"),
        (RESNET | {"depths": [1, "3", 5]}, "depths"),
        (RESNET | {"hidden_sizes": [16, 32, 2**40]}, "hidden_sizes"),
        (QWEN_MOE | {"mlp_only_layers": ["1"]}, "mlp_only_layers"),
    ],
)
def test_a_list_field_is_bounded_in_length_and_values(tmp_path, config, field):
    with pytest.raises(ArtifactError, match=rf"config\.json: field '{field}' must be a list of at most {MAX_LIST:,}"):
        estimate(write(tmp_path / "m", config))


@pytest.mark.parametrize("value", ["0.5", -1, 0, 1e308, True])
def test_a_multiplier_must_be_a_bounded_positive_number(tmp_path, value):
    # 1e308 meets the bound every float in a config is held to first
    message = r"config\.json: field 'depth_multiplier' (must be a number above 0|is 1e\+308; no model uses)"
    with pytest.raises(ArtifactError, match=message):
        estimate(write(tmp_path / "m", MOBILENET | {"depth_multiplier": value}))


def test_a_sliding_window_that_is_not_an_integer_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match=r"config\.json: field 'sliding_window' must be an integer"):
        estimate(write(tmp_path / "m", LLAMA | {"sliding_window": "4096"}))


def test_architectures_that_is_not_a_list_falls_back_to_the_model_type(tmp_path):
    assert estimate(write(tmp_path / "m", LLAMA | {"architectures": {"0": "x"}})).architecture == "llama"


def test_the_largest_dense_config_within_bounds_is_counted_at_once(tmp_path):
    config = LLAMA | {"num_hidden_layers": MAX_LAYERS, "hidden_size": 2**16, "intermediate_size": 2**18,
                      "num_attention_heads": 512, "num_key_value_heads": 64, "vocab_size": MAX_VOCAB}
    est = estimate(write(tmp_path / "m", config), dtype="bf16")
    assert est.parameters > 10**13 and est.total_bytes < MAX_ESTIMATE_BYTES


def test_sizes_whose_product_is_beyond_any_machine_are_refused(tmp_path):
    config = QWEN_MOE | {"num_hidden_layers": MAX_LAYERS, "hidden_size": MAX_HIDDEN, "num_experts": 2**14,
                         "moe_intermediate_size": MAX_HIDDEN, "num_attention_heads": 1024, "num_key_value_heads": 1024}
    with pytest.raises(ArtifactError, match=r"config\.json: the estimate's weights_bytes is .* beyond any machine"):
        estimate(write(tmp_path / "m", config))


# --- closed forms equal the per-layer walk they replaced ----------------------------------------


def _qwen_moe_sparse_by_walking(config: dict) -> int:
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers", [])
    return sum(1 for i in range(config["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0)


@pytest.mark.parametrize(
    ("step", "mlp_only"),
    [(1, []), (2, []), (3, [2, 5]), (2, [0, 1, 3, 3, 99]), (1, [0, 1, 2, 3, 4, 5]), (7, [])],
)
def test_qwen2_moe_sparse_layers_are_counted_like_the_per_layer_walk(step, mlp_only):
    config = QWEN_MOE | {"decoder_sparse_step": step, "mlp_only_layers": mlp_only}
    dense_only = count_parameters(ModelConfig(QWEN_MOE | {"decoder_sparse_step": 99})).parameters
    count = count_parameters(ModelConfig(config)).parameters
    cfg = ModelConfig(config)
    hidden = cfg.int("hidden_size")
    dense_mlp = 3 * hidden * cfg.int("intermediate_size")
    moe_mlp = hidden * 4 + 4 * 3 * hidden * 16 + 3 * hidden * 24 + hidden
    assert count == dense_only + _qwen_moe_sparse_by_walking(config) * (moe_mlp - dense_mlp)


def _resnet_by_walking(config: dict) -> int:
    """The per-block loop params.py used before, kept here as the reference."""
    total = 0

    def conv_bn(c_in, c_out, k):
        nonlocal total
        total += c_out * c_in * k * k + 2 * c_out

    conv_bn(3, config["embedding_size"], 7)
    c_in, bottleneck = config["embedding_size"], config.get("layer_type", "bottleneck") == "bottleneck"
    for stage, (c_out, depth) in enumerate(zip(config["hidden_sizes"], config["depths"], strict=False)):
        stride = (2 if config.get("downsample_in_first_stage") else 1) if stage == 0 else 2
        for i in range(depth):
            block_in, block_stride = (c_in, stride) if i == 0 else (c_out, 1)
            if block_in != c_out or block_stride != 1:
                conv_bn(block_in, c_out, 1)
            if bottleneck:
                conv_bn(block_in, c_out // 4, 1)
                conv_bn(c_out // 4, c_out // 4, 3)
                conv_bn(c_out // 4, c_out, 1)
            else:
                conv_bn(block_in, c_out, 3)
                conv_bn(c_out, c_out, 3)
        c_in = c_out
    return total + config["hidden_sizes"][-1] * 2 + 2  # classifier, 2 labels


@pytest.mark.parametrize("extra", [{}, {"layer_type": "basic"}, {"downsample_in_first_stage": True},
                                   {"hidden_sizes": [16, 16, 64], "depths": [4, 1, 2]}])
def test_resnet_stages_are_counted_like_the_per_block_walk(extra):
    config = RESNET | extra
    assert count_parameters(ModelConfig(config)).parameters == _resnet_by_walking(config)


def test_resnet_at_its_largest_depths_is_counted_and_estimated_at_once(tmp_path):
    config = RESNET | {"hidden_sizes": [64] * MAX_LIST, "depths": [MAX_LAYERS] * MAX_LIST}
    est = estimate(write(tmp_path / "m", config), seq=32)
    assert est.parameters > 0 and est.activation_bytes > 0
