"""A GGUF file's facts from its header (gguf_file.py), on the tiny files the writer makes (convert.py)."""

import pytest

from agent.artifacts.errors import ArtifactError
from agent.engines.llamacpp.gguf_file import GgufFacts, file_refusal, read_gguf


@pytest.mark.parametrize(("quant", "weight_bytes_per_value"), [("F32", 4), ("F16", 2), ("Q8_0", 34 / 32),
                                                               ("Q4_0", 18 / 32)])
def test_it_reads_a_tiny_llama_in_each_type(ggufs, quant, weight_bytes_per_value):
    facts = read_gguf(ggufs[quant])
    assert (facts.architecture, facts.kind, facts.quantization) == ("llama", "model", quant)
    assert (facts.block_count, facts.embedding_length, facts.head_count, facts.head_count_kv) == (2, 128, 2, 1)
    assert (facts.head_dim, facts.context_length, facts.vocab_tokens) == (64, 256, 1024)
    assert facts.chat_template
    # 16 weight matrices in the type asked for; the 5 norms stay F32.
    assert facts.tensor_types == ({"F32": 21} if quant == "F32" else {quant: 16, "F32": 5})
    matrices = 2 * 1024 * 128 + 2 * (128 * 128 * 2 + 64 * 128 * 2 + 3 * 128 * 256)
    norms = 4 * (128 * 5)
    assert facts.weights_bytes == int(matrices * weight_bytes_per_value) + norms
    assert facts.weights_bytes < facts.file_bytes
    assert file_refusal(facts) == ""


def test_its_shape_is_a_gguf_causal_lm(ggufs):
    shape = read_gguf(ggufs["Q4_0"]).shape()
    assert (shape.model_type, shape.architecture, shape.task, shape.stored_dtype) == ("gguf", "llama", "causal-lm",
                                                                                      "Q4_0")
    assert (shape.head_dim, shape.vocab_size, shape.tokenizer_ids) == (64, 1024, 1024)


def test_its_kv_cache_per_token_counts_every_layer(ggufs):
    # 2 layers x 1 KV head x (64 key + 64 value) x 2 bytes.
    assert read_gguf(ggufs["Q8_0"]).kv_bytes_per_token() == 512


def test_it_refuses_a_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ArtifactError, match="not a GGUF file"):
        read_gguf(path)


def test_it_refuses_a_directory(tmp_path):
    with pytest.raises(ArtifactError, match="is not a file"):
        read_gguf(tmp_path)


def test_it_refuses_a_header_cut_short(ggufs, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(ggufs["Q8_0"].read_bytes()[:2000])
    with pytest.raises(ArtifactError, match="cannot be read as GGUF"):
        read_gguf(path)


def _facts(**changes) -> GgufFacts:
    base = {"path": "/m/x.gguf", "file_bytes": 10, "architecture": "llama", "kind": "model", "name": "x",
            "quantization": "Q8_0", "vocab_tokens": 1024}
    return GgufFacts(**(base | changes))


def test_it_refuses_an_adapter_a_projector_and_a_split_part():
    assert "a GGUF adapter, not a model" in file_refusal(_facts(kind="adapter"))
    assert "one of 3 parts of a split GGUF" in file_refusal(_facts(split_count=3))
    assert "no vocabulary" in file_refusal(_facts(vocab_tokens=0))
    assert _facts(architecture="clip").task == ""
    assert _facts(architecture="bert").task == "encoder"
