"""What the llamacpp engine refuses from a model's shape (check.py), and what it says of itself."""

from agent.artifacts.capability import ModelShape
from agent.engines.llamacpp import LlamacppEngine
from agent.engines.llamacpp.gguf_file import read_gguf

ENGINE = LlamacppEngine()


def _shape(**changes) -> ModelShape:
    return ModelShape(**({"architecture": "llama", "model_type": "gguf", "task": "causal-lm",
                          "stored_dtype": "Q4_0"} | changes))


def test_it_runs_the_tiny_gguf_on_cpu_and_cuda(ggufs):
    shape = read_gguf(ggufs["Q4_0"]).shape()
    assert ENGINE.refusal(shape, "cpu") == ENGINE.refusal(shape, "cuda") == ""


def test_it_refuses_a_safetensors_directory_saying_how_to_convert_it():
    why = ENGINE.refusal(_shape(architecture="LlamaForCausalLM", model_type="llama", stored_dtype="float32"), "cpu")
    assert "llama.cpp runs GGUF files; this model is a llama directory" in why
    assert "convert_hf_to_gguf.py" in why


def test_it_refuses_an_architecture_its_llama_cpp_does_not_know():
    assert "'llama9' is not one this build of llama.cpp knows" in ENGINE.refusal(_shape(architecture="llama9"), "cpu")


def test_it_refuses_an_encoder_and_a_projector():
    assert "this model is an encoder" in ENGINE.refusal(_shape(architecture="bert", task="encoder"), "cpu")
    assert "this model is a clip file" in ENGINE.refusal(_shape(architecture="clip", task=""), "cpu")


def test_it_never_sleeps_and_passes_openai_bodies_through():
    assert not ENGINE.sleeps_on("cpu") and not ENGINE.sleeps_on("cuda")
    assert ENGINE.passes_openai_bodies and ENGINE.relays_metrics and ENGINE.seq_caps_context and not ENGINE.in_worker
    assert ENGINE.program is not None and ENGINE.program.env == "MODELGRID_LLAMA_PYTHON"


def test_it_has_no_version_without_a_program(tmp_path):
    assert ENGINE.version(None) == ""
    assert ENGINE.version(str(tmp_path / "missing")) == ""
