"""The line of llama-server's log that says why it failed (failure.py), on lines as llama.cpp prints them."""

from agent.engines.llamacpp import LlamacppEngine

ENGINE = LlamacppEngine()

# As llama-server printed them for a file without output_norm.weight (tests/.../test_server.py makes one).
MISSING_TENSOR = """\
warning: no usable GPU found, --gpu-layers option will be ignored
0.00.015.056 I srv    load_model: loading model '/tmp/broken.gguf'
0.00.306.091 E llama_model_load: error loading model: check_tensor_dims: tensor 'output_norm.weight' not found
0.00.306.430 E llama_model_load_from_file_impl: failed to load model
0.00.306.551 E common_fit_params: encountered an error while trying to fit params to free device memory: failed to \
load model
0.00.331.187 E cmn  common_init_: failed to load model '/tmp/broken.gguf'
0.00.331.238 E srv    load_model: failed to load model, '/tmp/broken.gguf'
0.00.331.289 I srv    operator(): operator(): cleaning up before exit...
0.00.331.809 E srv  llama_server: exiting due to model loading error"""

BAD_MAGIC = """\
gguf_init_from_file_impl: invalid magic characters: 'abcd', expected 'GGUF'
llama_model_load: error loading model: llama_model_loader: failed to load model from /tmp/x.gguf
llama_model_load_from_file_impl: failed to load model
main: exiting due to model loading error"""


def test_it_names_the_loaders_own_cause():
    assert ENGINE.failure_reason(MISSING_TENSOR.splitlines()) == (
        "check_tensor_dims: tensor 'output_norm.weight' not found")


def test_where_the_loader_only_wraps_it_names_the_parsers_cause():
    assert ENGINE.failure_reason(BAD_MAGIC.splitlines()) == "invalid magic characters: 'abcd', expected 'GGUF'"


def test_it_names_a_bad_argument_and_an_uncaught_exception():
    assert ENGINE.failure_reason(["error: invalid argument: --nope"]) == "error: invalid argument: --nope"
    assert ENGINE.failure_reason(["terminate called after throwing an instance of 'std::runtime_error'",
                                  "  what():  unknown model architecture: 'llama9'"]) == (
        "unknown model architecture: 'llama9'")


def test_lines_that_only_say_it_failed_name_nothing():
    assert ENGINE.failure_reason(["main: exiting due to model loading error", "srv    load_model: failed to "
                                  "load model, '/x.gguf'"]) == ""
