"""config.json that contradicts itself, holds absurd numbers, or contradicts its weights is refused naming the key.

Before the fix `num_key_value_heads` above `num_attention_heads`, a hidden size that the heads do not
divide and `rope_theta: 1e308` were registered, and the worker then died on load or on its first
completion (rotary frequencies overflow to inf). Weights whose shapes disagree with the config were
registered too, and the loader refused them at deploy time, over and over.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from agent.artifacts import ArtifactError, estimate, inspect_model_dir, read_model_dir

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 16,
         "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}
MISTRAL = LLAMA | {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}
QWEN2 = LLAMA | {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
QWEN2_MOE = QWEN2 | {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 2,
                     "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "mlp_only_layers": [0],
                     "num_hidden_layers": 2}
BERT = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 32, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 8,
        "type_vocab_size": 2}
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 32, "n_embd": 16, "n_layer": 1,
        "n_head": 4, "n_positions": 8}
DISTILBERT = {"model_type": "distilbert", "architectures": ["DistilBertModel"], "vocab_size": 32, "dim": 16,
              "hidden_dim": 24, "n_heads": 4, "n_layers": 1, "max_position_embeddings": 8}


def decoder_tensors(config: dict, dtype=np.float16) -> dict[str, np.ndarray]:
    """Every weight a Llama-like decoder layer stack holds, shaped as the config says."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv, hd = config.get("num_key_value_heads", heads), config.get("head_dim") or hidden // heads
    vocab, inter = config["vocab_size"], config["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden),
              "model.norm.weight": (hidden,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (heads * hd, hidden),
                   p + "self_attn.k_proj.weight": (kv * hd, hidden), p + "self_attn.v_proj.weight": (kv * hd, hidden),
                   p + "self_attn.o_proj.weight": (hidden, heads * hd),
                   p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                   p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,)}
    return {name: np.zeros(shape, dtype) for name, shape in shapes.items()}


def bert_tensors(config: dict) -> dict[str, np.ndarray]:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    p = "encoder.layer.0."
    shapes = {"embeddings.word_embeddings.weight": (config["vocab_size"], hidden),
              "embeddings.position_embeddings.weight": (config["max_position_embeddings"], hidden),
              "embeddings.token_type_embeddings.weight": (config["type_vocab_size"], hidden),
              p + "attention.self.query.weight": (hidden, hidden), p + "attention.self.key.weight": (hidden, hidden),
              p + "attention.self.value.weight": (hidden, hidden),
              p + "attention.output.dense.weight": (hidden, hidden),
              p + "intermediate.dense.weight": (inter, hidden), p + "output.dense.weight": (hidden, inter),
              "pooler.dense.weight": (hidden, hidden)}
    return {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}


def write(path: Path, config: dict, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A model directory: `config` as config.json and `tensors` (default: a tiny one) as model.safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors if tensors is not None else {"w": np.zeros(4, np.float32)}, str(path / "model.safetensors"))
    return path


# --- the config contradicts itself ----------------------------------------------------------------------


def test_a_grouped_query_llama_whose_weights_match_its_config_is_accepted(tmp_path):
    artifact = inspect_model_dir(write(tmp_path / "m", LLAMA, decoder_tensors(LLAMA)))
    assert artifact.task == "causal-lm"


@pytest.mark.parametrize(("config", "message"), [
    (LLAMA | {"num_key_value_heads": 8}, r"field 'num_key_value_heads' is 8, more than num_attention_heads \(4\)"),
    (MISTRAL | {"num_key_value_heads": 8}, r"field 'num_key_value_heads' is 8, more than num_attention_heads"),
    (LLAMA | {"hidden_size": 24, "num_attention_heads": 6, "num_key_value_heads": 4},
     r"field 'num_key_value_heads' is 4, which does not divide num_attention_heads \(6\)"),
])
def test_key_value_heads_must_divide_the_attention_heads(tmp_path, config, message):
    with pytest.raises(ArtifactError, match=rf"config\.json: {message}"):
        inspect_model_dir(write(tmp_path / "m", config))


@pytest.mark.parametrize(("config", "hidden", "heads"), [
    (LLAMA | {"hidden_size": 18}, "hidden_size", "num_attention_heads"),
    (LLAMA | {"hidden_size": 18, "head_dim": 4}, "hidden_size", "num_attention_heads"),  # LlamaConfig checks anyway
    (MISTRAL | {"hidden_size": 18}, "hidden_size", "num_attention_heads"),
    (QWEN2 | {"hidden_size": 18}, "hidden_size", "num_attention_heads"),
    (BERT | {"hidden_size": 18}, "hidden_size", "num_attention_heads"),
    (GPT2 | {"n_embd": 18}, "n_embd", "n_head"),
    (DISTILBERT | {"dim": 18}, "dim", "n_heads"),
])
def test_a_hidden_size_the_heads_do_not_divide_is_refused(tmp_path, config, hidden, heads):
    message = rf"config\.json: field '{hidden}' is 18, not a multiple of {heads} \(4\)"
    with pytest.raises(ArtifactError, match=message):
        read_model_dir(write(tmp_path / "m", config))


def test_an_explicit_head_dim_frees_the_hidden_size_where_the_architecture_allows_it(tmp_path):
    # Mistral-Nemo's shape: hidden 5120, 32 heads of 128. Here hidden 20, 4 heads of 8.
    config = MISTRAL | {"hidden_size": 20, "head_dim": 8, "intermediate_size": 12}
    artifact = inspect_model_dir(write(tmp_path / "m", config, decoder_tensors(config)))
    assert artifact.parameters > 0
    gemma = LLAMA | {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "head_dim": 8,
                     "num_key_value_heads": 1}
    assert inspect_model_dir(write(tmp_path / "g", gemma, decoder_tensors(gemma))).model_type == "gemma"


@pytest.mark.parametrize(("config", "message"), [
    (MISTRAL | {"hidden_size": 20}, r"a head size of 5 \(hidden_size 20 / num_attention_heads 4\)"),
    (MISTRAL | {"head_dim": 5}, r"field 'head_dim' is 5"),
])
def test_an_odd_head_size_is_refused_where_rotary_embeddings_rotate_pairs(tmp_path, config, message):
    with pytest.raises(ArtifactError, match=rf"config\.json: {message}.*must be even"):
        inspect_model_dir(write(tmp_path / "m", config))


# --- absurd numbers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "field"), [
    ({"rope_theta": 1e308}, "rope_theta"),
    ({"rope_theta": 0}, "rope_theta"),
    ({"rope_theta": -10000.0}, "rope_theta"),
    ({"rope_theta": "10000"}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e308}}, "rope_parameters.rope_theta"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "8"}}, "rope_scaling.factor"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e300}}}, "rope_parameters.full_attention.rope_theta"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": -1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, "rope_scaling.low_freq_factor"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1e300], "long_factor": [1.0, 2.0]}},
     "rope_scaling.short_factor"),
    ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
    ({"rms_norm_eps": 1e30}, "rms_norm_eps"),
])
def test_a_rotary_or_norm_number_no_real_model_uses_is_refused_naming_the_key(tmp_path, extra, field):
    with pytest.raises(ArtifactError, match=rf"config\.json: field '{field}' must be"):
        inspect_model_dir(write(tmp_path / "m", LLAMA | extra))


@pytest.mark.parametrize(("extra", "field"), [
    ({"attn_logit_softcapping": 1e308}, "attn_logit_softcapping"),
    ({"text_config": {"scale": [1.0, -1e200]}}, "text_config.scale"),
])
def test_any_number_large_enough_to_overflow_the_workers_arithmetic_is_refused(tmp_path, extra, field):
    with pytest.raises(ArtifactError, match=rf"config\.json: field '{field}' is -?1e\+\d+; no model uses a number"):
        estimate(write(tmp_path / "m", LLAMA | extra))


@pytest.mark.parametrize("extra", [
    {"rope_theta": 500000.0}, {"rope_theta": 10000}, {"rope_theta": 3580165449.0},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}},
    {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "beta_fast": 32,
                         "beta_slow": 1, "original_max_position_embeddings": 32768}},
    {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [1.0, 2.0],
                      "original_max_position_embeddings": 4096}},
    {"rope_scaling": None}, {"rms_norm_eps": 1e-5}, {"initializer_range": 0.02},
])
def test_the_numbers_real_models_use_are_accepted(tmp_path, extra):
    assert inspect_model_dir(write(tmp_path / "m", LLAMA | extra)).model_type == "llama"


def test_a_config_only_estimate_refuses_a_contradiction_too(tmp_path):
    path = tmp_path / "c"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(LLAMA | {"num_key_value_heads": 8}))
    with pytest.raises(ArtifactError, match=r"config\.json: field 'num_key_value_heads' is 8"):
        estimate(path)


# --- the weights contradict the config ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "wrong", "expected", "why"), [
    ("model.layers.0.self_attn.q_proj.weight", (8, 16), r"\[16, 16\]",
     r"num_attention_heads 4 × head_dim 4, hidden_size 16"),
    ("model.layers.0.self_attn.k_proj.weight", (16, 16), r"\[8, 16\]",
     r"num_key_value_heads 2 × head_dim 4, hidden_size 16"),
    ("model.layers.0.self_attn.o_proj.weight", (16, 8), r"\[16, 16\]",
     r"hidden_size 16, num_attention_heads 4 × head_dim 4"),
    ("model.layers.0.mlp.down_proj.weight", (16, 32), r"\[16, 24\]", r"hidden_size 16, intermediate_size 24"),
    ("model.embed_tokens.weight", (40, 16), r"\[32, 16\]", r"vocab_size 32, hidden_size 16"),
    ("lm_head.weight", (32, 12), r"\[32, 16\]", r"vocab_size 32, hidden_size 16"),
])
def test_a_decoder_weight_whose_shape_disagrees_with_the_config_is_refused_naming_both_shapes(
        tmp_path, name, wrong, expected, why):
    tensors = decoder_tensors(LLAMA) | {name: np.zeros(wrong, np.float16)}
    shown = rf"\[{wrong[0]}, {wrong[1]}\]"
    message = (rf"m/model\.safetensors: tensor '{name}' has shape {shown}, but .*config\.json implies {expected} "
               rf"\({why}\)")
    with pytest.raises(ArtifactError, match=message):
        inspect_model_dir(write(tmp_path / "m", LLAMA, tensors))


def test_moe_experts_and_the_shared_expert_are_not_held_to_the_dense_intermediate_size(tmp_path):
    tensors = decoder_tensors(QWEN2_MOE)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("model.layers.1.mlp.")}
    p = "model.layers.1.mlp."
    tensors |= {p + "gate.weight": np.zeros((2, 16), np.float16),
                p + "experts.0.gate_proj.weight": np.zeros((8, 16), np.float16),
                p + "shared_expert.gate_proj.weight": np.zeros((12, 16), np.float16)}
    assert inspect_model_dir(write(tmp_path / "m", QWEN2_MOE, tensors)).model_type == "qwen2_moe"
    # layer 0 is dense (mlp_only_layers): its MLP is held to intermediate_size
    tensors["model.layers.0.mlp.gate_proj.weight"] = np.zeros((8, 16), np.float16)
    with pytest.raises(ArtifactError, match=r"tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[8, 16\]"):
        inspect_model_dir(write(tmp_path / "m2", QWEN2_MOE, tensors))


def test_a_bert_weight_whose_shape_disagrees_with_the_config_is_refused(tmp_path):
    assert inspect_model_dir(write(tmp_path / "ok", BERT, bert_tensors(BERT))).task == "encoder"
    for name, wrong in (("encoder.layer.0.attention.self.query.weight", (12, 16)),
                        ("encoder.layer.0.output.dense.weight", (16, 16)),
                        ("embeddings.position_embeddings.weight", (512, 16))):
        tensors = bert_tensors(BERT) | {name: np.zeros(wrong, np.float32)}
        with pytest.raises(ArtifactError, match=rf"tensor '{name}' has shape \[{wrong[0]}, {wrong[1]}\], but"):
            inspect_model_dir(write(tmp_path / name, BERT, tensors))


def test_a_prefixed_bert_checkpoint_is_checked_by_its_last_name_parts(tmp_path):
    tensors = {f"bert.{k}": v for k, v in bert_tensors(BERT).items()}
    tensors["bert.encoder.layer.0.intermediate.dense.weight"] = np.zeros((20, 16), np.float32)
    with pytest.raises(ArtifactError, match=r"'bert\.encoder\.layer\.0\.intermediate\.dense\.weight' has shape "
                                            r"\[20, 16\], but .*implies \[24, 16\] \(intermediate_size 24, hidden"):
        inspect_model_dir(write(tmp_path / "m", BERT, tensors))


def test_packed_integer_weights_of_a_quantised_checkpoint_are_not_compared_with_the_float_shape(tmp_path):
    # 4-bit quantisers store q_proj.weight as packed bytes of another shape, and say so in quantization_config.
    quantised = LLAMA | {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    tensors = decoder_tensors(LLAMA) | {"model.layers.0.self_attn.q_proj.weight": np.zeros((128, 1), np.uint8)}
    assert inspect_model_dir(write(tmp_path / "m", quantised, tensors)).parameters > 0


@pytest.mark.parametrize(("config", "tensors", "name", "shape"), [
    # The probe: an I64 tensor at half the width spans the bytes of the F32 one it replaces, so every byte count
    # held; the loader builds a float [32, 16] and cannot copy it in, on every start.
    (LLAMA, lambda: decoder_tensors(LLAMA, np.float32) | {"model.embed_tokens.weight": np.zeros((32, 8), np.int64)},
     "model.embed_tokens.weight", r"I64 \[32, 8\]"),
    (LLAMA, lambda: decoder_tensors(LLAMA) | {"model.layers.0.self_attn.q_proj.weight": np.zeros((128, 1), np.uint8)},
     r"model.layers.0.self_attn.q_proj.weight", r"U8 \[128, 1\]"),
    # Families without a shape table are held to it too: GPT-2's wte at half width.
    (GPT2, lambda: {"transformer.wte.weight": np.zeros((32, 8), np.int64)}, "transformer.wte.weight",
     r"I64 \[32, 8\]"),
])
def test_integer_weights_without_a_quantization_config_are_refused_naming_the_tensor(tmp_path, config, tensors, name,
                                                                                     shape):
    with pytest.raises(ArtifactError, match=rf"m/model\.safetensors: tensor '{name}' is stored as {shape}, but "
                                            r".*config\.json declares no quantization_config"):
        inspect_model_dir(write(tmp_path / "m", config, tensors()))


def test_integer_buffers_that_are_no_weights_are_still_accepted(tmp_path):
    tensors = decoder_tensors(LLAMA) | {"model.position_ids": np.arange(8, dtype=np.int64)}
    assert inspect_model_dir(write(tmp_path / "m", LLAMA, tensors)).parameters > 0


def test_what_transformers_writes_for_each_family_is_accepted(tmp_path):
    transformers = pytest.importorskip("transformers")
    small = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 128, "max_position_embeddings": 64}
    gqa = small | {"num_key_value_heads": 2}
    built = {
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(**gqa, head_dim=32)),
        "mistral": transformers.MistralForCausalLM(transformers.MistralConfig(**gqa | {"hidden_size": 80},
                                                                              head_dim=16)),
        "gemma": transformers.GemmaForCausalLM(transformers.GemmaConfig(**gqa, head_dim=32)),
        "qwen2_moe": transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
            **gqa, num_experts=2, moe_intermediate_size=32, shared_expert_intermediate_size=48, mlp_only_layers=[0])),
        "bert": transformers.BertForMaskedLM(transformers.BertConfig(**small)),
        "roberta": transformers.RobertaModel(transformers.RobertaConfig(**small | {"max_position_embeddings": 66},
                                                                        type_vocab_size=1)),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128)),
    }
    for name, model in built.items():
        model.save_pretrained(tmp_path / name)
        assert read_model_dir(tmp_path / name).model_type == name
