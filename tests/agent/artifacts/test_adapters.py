import json
import math
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from agent.artifacts import ArtifactError, read_model_dir
from agent.artifacts.adapters import check_adapter_matches, read_adapter_dir
from tests.adapter_files import write_adapter
from tests.conftest import write_model_dir

UP = "model.layers.0.mlp.up_proj"


@pytest.fixture
def adapter_dir(tmp_path):
    return write_adapter(tmp_path / "ad", {UP: (8, 16, 32)})


def test_it_reads_ranks_scales_and_bytes_from_the_header(tmp_path):
    ranks = (("q_proj", 8), ("v_proj", 4))
    modules = {f"model.layers.{i}.self_attn.{p}": (r, 64, 64) for i in (0, 1) for p, r in ranks}
    path = write_adapter(tmp_path / "a", modules, rank_pattern={"v_proj": 4},
                         alpha_pattern={"layers.1.self_attn.q_proj": 4}, target_modules=["q_proj", "v_proj"])
    adapter = read_adapter_dir(path)
    assert adapter.ranks == {"model.layers.0.self_attn.q_proj": 8, "model.layers.0.self_attn.v_proj": 4,
                             "model.layers.1.self_attn.q_proj": 8, "model.layers.1.self_attn.v_proj": 4}
    scales = {m.name: m.scale for m in adapter.modules}
    assert scales["model.layers.0.self_attn.q_proj"] == 16 / 8
    assert scales["model.layers.0.self_attn.v_proj"] == 16 / 4
    assert scales["model.layers.1.self_attn.q_proj"] == 4 / 8
    assert adapter.target_modules == ("q_proj", "v_proj")
    assert adapter.stored_dtype == "F32"
    params = 2 * (8 * 128 + 4 * 128)
    assert adapter.parameters == params
    assert adapter.stored_bytes == params * 4 == sum(t.nbytes for t in adapter.tensors)
    assert adapter.bytes_at("bf16") == params * 2


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path):
    adapter = read_adapter_dir(write_adapter(tmp_path / "a", {UP: (16, 16, 32)}, r=16, use_rslora=True))
    assert adapter.modules[0].scale == pytest.approx(16 / math.sqrt(16))


def test_it_refuses_a_missing_directory(tmp_path):
    with pytest.raises(ArtifactError, match="no such directory"):
        read_adapter_dir(tmp_path / "nope")


def test_it_refuses_a_directory_without_adapter_config(tmp_path):
    with pytest.raises(ArtifactError, match=r"no adapter_config\.json"):
        read_adapter_dir(tmp_path)


@pytest.mark.parametrize("peft_type", ["IA3", "PREFIX_TUNING", None])
def test_it_refuses_adapters_that_are_not_lora(adapter_dir, peft_type):
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    config["peft_type"] = peft_type
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match=rf"adapter_config\.json: peft_type is {peft_type!r}; .*LoRA"):
        read_adapter_dir(adapter_dir)


def test_it_names_the_file_of_malformed_json(adapter_dir):
    (adapter_dir / "adapter_config.json").write_text('{"peft_type": "LORA",')
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: not valid JSON"):
        read_adapter_dir(adapter_dir)


def test_it_refuses_an_adapter_without_safetensors_weights_and_never_reads_the_pickle(adapter_dir):
    (adapter_dir / "adapter_model.safetensors").rename(adapter_dir / "adapter_model.bin")
    with pytest.raises(ArtifactError, match=r"no adapter_model\.safetensors \(adapter_model\.bin is a pickle"):
        read_adapter_dir(adapter_dir)


def test_it_refuses_a_header_whose_offsets_lie(adapter_dir):
    f = adapter_dir / "adapter_model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    key = f"base_model.model.{UP}.lora_B.weight"
    header[key]["shape"] = [64, 8]  # claims twice the bytes its offsets hold
    body = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    with pytest.raises(ArtifactError, match=rf"adapter_model\.safetensors: tensor '{key}' data_offsets"):
        read_adapter_dir(adapter_dir)


@pytest.mark.parametrize(
    ("field", "value"), [("use_dora", True), ("modules_to_save", ["lm_head"]), ("lora_bias", True)]
)
def test_it_refuses_features_a_multi_lora_forward_cannot_serve(adapter_dir, field, value):
    config = json.loads((adapter_dir / "adapter_config.json").read_text()) | {field: value}
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match=rf"adapter_config\.json: {field} is set"):
        read_adapter_dir(adapter_dir)


def test_it_refuses_trained_base_biases(tmp_path):
    with pytest.raises(ArtifactError, match="bias is 'all'"):
        read_adapter_dir(write_adapter(tmp_path / "a", {UP: (8, 16, 32)}, bias="all"))


def test_it_refuses_a_rank_that_disagrees_with_the_config(tmp_path):
    path = write_adapter(tmp_path / "a", {UP: (4, 16, 32)}, r=8)
    with pytest.raises(ArtifactError, match=f"module {UP} has rank 4, but adapter_config.json says 8"):
        read_adapter_dir(path)


def test_it_refuses_a_tensor_that_is_not_a_lora_weight(tmp_path):
    path = tmp_path / "a"
    write_adapter(path, {UP: (8, 16, 32)})
    save_file({f"base_model.model.{UP}.lora_A.weight": np.ones((8, 16), np.float32),
               f"base_model.model.{UP}.lora_B.weight": np.ones((32, 8), np.float32),
               "base_model.model.lm_head.weight": np.ones((4, 4), np.float32)}, str(path / "adapter_model.safetensors"))
    with pytest.raises(ArtifactError, match="'base_model.model.lm_head.weight' is not a LoRA A/B weight"):
        read_adapter_dir(path)


def test_it_refuses_a_module_without_its_b_half(tmp_path):
    path = tmp_path / "a"
    write_adapter(path, {UP: (8, 16, 32)})
    save_file({f"base_model.model.{UP}.lora_A.weight": np.ones((8, 16), np.float32)},
              str(path / "adapter_model.safetensors"))
    with pytest.raises(ArtifactError, match=f"module {UP} has no lora_B.weight"):
        read_adapter_dir(path)


def test_an_adapter_that_fits_reports_its_bytes_at_the_serving_dtype(tmp_path, model_dir):
    adapter = read_adapter_dir(write_adapter(tmp_path / "a", {UP: (8, 16, 32)}))
    fit = check_adapter_matches(adapter, read_model_dir(model_dir), "float16")
    assert fit.nbytes == 8 * (16 + 32) * 2
    assert fit.base_tensors == {UP: f"{UP}.weight"}
    assert check_adapter_matches(adapter, read_model_dir(model_dir)).nbytes == 8 * (16 + 32) * 4  # stored dtype


def test_it_names_the_first_module_whose_shape_does_not_fit(tmp_path):
    model = read_model_dir(write_model_dir(tmp_path / "m", hidden=64))  # up_proj is [128, 64]
    adapter = read_adapter_dir(write_adapter(tmp_path / "a", {UP: (8, 64, 64)}))
    message = rf"adapter targets {UP} with in=64, out=64; the base model's tensor is \[128, 64\]"
    with pytest.raises(ArtifactError, match=message):
        check_adapter_matches(adapter, model)


def test_it_names_a_module_the_base_model_does_not_have(tmp_path, model_dir):
    adapter = read_adapter_dir(write_adapter(tmp_path / "a", {"model.layers.7.mlp.up_proj": (8, 16, 32)}))
    with pytest.raises(ArtifactError, match="adapter targets model.layers.7.mlp.up_proj, but the base model"):
        check_adapter_matches(adapter, read_model_dir(model_dir))


def test_it_accepts_gpt2_conv1d_weights_stored_in_out_and_a_head_model_prefix(tmp_path):
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                                                   "n_embd": 16, "n_head": 4, "n_layer": 1, "vocab_size": 32}))
    save_file({"wte.weight": np.zeros((32, 16), np.float32), "h.0.attn.c_attn.weight": np.zeros((16, 48), np.float32)},
              str(model / "model.safetensors"))
    adapter = read_adapter_dir(write_adapter(tmp_path / "a", {"transformer.h.0.attn.c_attn": (8, 16, 48)},
                                             fan_in_fan_out=True))
    fit = check_adapter_matches(adapter, read_model_dir(model))
    assert fit.base_tensors == {"transformer.h.0.attn.c_attn": "h.0.attn.c_attn.weight"}


def test_it_reads_what_peft_writes(tmp_path):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agent.workers.demo_models import build_tiny_llama

    base = build_tiny_llama(tmp_path / "llama")
    config = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "down_proj"], rank_pattern={"down_proj": 2},
                        alpha_pattern={"down_proj": 4}, use_rslora=True, init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(tmp_path / "ad")
    adapter = read_adapter_dir(tmp_path / "ad")
    assert adapter.ranks == {"model.layers.0.mlp.down_proj": 2, "model.layers.0.self_attn.q_proj": 8,
                             "model.layers.1.mlp.down_proj": 2, "model.layers.1.self_attn.q_proj": 8}
    scales = {m.name: m.scale for m in adapter.modules}
    assert scales["model.layers.0.mlp.down_proj"] == pytest.approx(4 / math.sqrt(2))
    assert scales["model.layers.0.self_attn.q_proj"] == pytest.approx(32 / math.sqrt(8))
    assert adapter.base_model == str(base)
    fit = check_adapter_matches(adapter, read_model_dir(base), "bfloat16")
    assert fit.nbytes == 2 * (8 * (64 + 64) + 2 * (128 + 64)) * 2
