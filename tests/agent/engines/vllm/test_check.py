"""vLLM's capability check: what its CPU build and its CUDA build refuse, from a model's files alone."""

import json

from agent.artifacts import inspect_model_dir
from agent.artifacts.capability import model_shape
from agent.engines import refusal, refusals, sleeps_on
from tests.conftest import write_model_dir


def shape_of(path):
    return model_shape(inspect_model_dir(path))


def test_heads_of_16_are_refused_on_cpu_naming_the_need_and_taken_on_cuda(tmp_path):
    """The demo tiny-llama's shape: 64 wide, 4 heads. vLLM's CPU build started it, read healthy and died at the
    first request; its CUDA backends take such heads."""
    shape = shape_of(write_model_dir(tmp_path / "m", hidden=64))
    assert shape.head_dim == 16
    assert refusal("vllm", shape, "cpu") == "vLLM's CPU attention needs head_dim >= 32; this model's heads are 16 wide"
    assert refusal("vllm", shape, "cuda") == ""
    assert refusals(shape) == {"vllm": {"cpu": refusal("vllm", shape, "cpu")}}


def test_a_head_width_between_the_cpu_kernels_is_refused_with_those_it_takes(tmp_path):
    shape = shape_of(write_model_dir(tmp_path / "m", hidden=4 * 48))
    why = refusal("vllm", shape, "cpu")
    assert "a head_dim of 32, 64, 80" in why and "are 48 wide" in why
    assert refusal("vllm", shape_of(write_model_dir(tmp_path / "ok", hidden=4 * 64)), "cpu") == ""


def test_a_tokenizer_past_the_vocabulary_is_refused_on_every_device(tmp_path):
    path = write_model_dir(tmp_path / "m", hidden=128, vocab=32)
    vocab = {f"t{i}": i for i in range(30)}
    (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab},
                                                     "added_tokens": [{"id": 40, "content": "<pad>"}]}))
    shape = shape_of(path)
    assert shape.tokenizer_ids == 41
    for device in ("cpu", "cuda"):
        assert refusal("vllm", shape, device) == ("its tokenizer makes ids up to 40, past its vocab_size of 32: vLLM "
                                                  "needs the vocabulary to cover every id its tokenizer makes")
    assert refusal("torch", shape, "cpu") == ""


def test_an_encoder_is_refused_and_the_built_in_engine_takes_it(tmp_path):
    path = write_model_dir(tmp_path / "bert", hidden=128, arch="BertModel", model_type="bert")
    shape = shape_of(path)
    assert refusal("vllm", shape, "cuda") == "vLLM serves causal language models here; this model is an encoder"
    assert refusals(shape) == {"vllm": {"cpu": refusal("vllm", shape, "cpu"), "cuda": refusal("vllm", shape, "cuda")}}


def test_vllm_sleeps_only_on_cuda_and_the_built_in_engine_everywhere():
    assert (sleeps_on("vllm", "cpu"), sleeps_on("vllm", "cuda")) == (False, True)
    assert sleeps_on("torch", "cpu") and sleeps_on("torch", "cuda")
