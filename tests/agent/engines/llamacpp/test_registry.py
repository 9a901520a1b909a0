"""The llamacpp engine in the registry: it claims GGUF files and reads, shapes and sizes them; the engines that read
safetensors directories refuse them, and it refuses directories; auto runs a GGUF file on it and nothing else."""

from __future__ import annotations

import pytest

import agent.engines as engines
from agent.artifacts import ArtifactError
from agent.engines.llamacpp.estimate import estimate_gguf
from agent.engines.llamacpp.gguf_file import read_gguf


def test_the_registry_gives_a_gguf_file_to_llamacpp_and_a_directory_to_the_built_in_engine(ggufs, tiny_llama):
    assert engines.reader(ggufs["Q4_0"]).name == "llamacpp"
    assert engines.reader(tiny_llama) is engines.BUILTIN
    model = engines.inspect(ggufs["Q4_0"])
    assert (model.format, model.architecture, model.task, model.stored_dtype) == ("gguf", "llama", "causal-lm", "Q4_0")
    assert model.files == (ggufs["Q4_0"].resolve(),) and model.sources == model.files
    assert model.parameters == read_gguf(ggufs["Q4_0"]).parameters > 0
    assert engines.inspect(tiny_llama).format == "safetensors"


def test_a_gguf_file_outside_the_model_roots_is_not_read(ggufs, tmp_path):
    with pytest.raises(ArtifactError, match="outside"):
        engines.inspect(ggufs["Q4_0"], roots=(tmp_path,))


def test_each_engine_refuses_the_other_format_and_names_the_one_that_reads_it(ggufs, tiny_llama):
    gguf = engines.shape(engines.inspect(ggufs["Q8_0"]))
    folder = engines.shape(engines.inspect(tiny_llama))
    for name in ("torch", "vllm"):
        assert engines.refusal(name, gguf, "cpu") == (f"engine {name} runs safetensors models; this model is a gguf "
                                                      "file: deploy it with engine llamacpp")
    assert engines.refusal("llamacpp", gguf, "cpu") == ""
    assert engines.refusal("llamacpp", folder, "cuda").startswith("engine llamacpp runs gguf models")
    # What is stored at registration: the capability checks of the engines of its format only.
    assert "llamacpp" not in engines.refusals(folder) and set(engines.refusals(gguf)) <= {"llamacpp"}


def test_auto_runs_a_gguf_file_on_llamacpp_and_a_directory_never_on_it():
    everything = {"torch": "x", "vllm": "x", "llamacpp": "x"}
    assert engines.auto_engine(everything, "causal-lm", False, {}, "gguf") == "llamacpp"
    assert engines.auto_engine({"torch": "x"}, "causal-lm", True, {}, "gguf") == "llamacpp"  # the agent says why
    assert engines.auto_engine(everything, "causal-lm", False, {}, "safetensors") == "torch"
    assert engines.auto_engine(everything, "causal-lm", True, {}, None) == "vllm"


def test_a_gguf_file_is_sized_from_its_header_through_the_registry(ggufs):
    facts = read_gguf(ggufs["F16"])
    by_path = engines.estimate_model(str(ggufs["F16"]), seq=128, device="cpu")
    assert by_path == estimate_gguf(facts, 128, "cpu")
    assert engines.estimate_model(engines.inspect(ggufs["F16"]), device="cuda") == estimate_gguf(facts, None, "cuda")
    assert engines.for_engine(by_path, "llamacpp") == by_path  # its runtime is in the header's estimate already
