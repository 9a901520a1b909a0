"""A deployment's engine arguments are an allowlist of flags AND values: nothing that names a file or module vLLM
imports, numbers within ranges, choices from vLLM's own, JSON-valued flags with listed keys and values, tensor x
pipeline parallelism equal to the replica's GPUs; each refusal names the argument and what it takes."""

import pytest

from agent.engines import ENGINES
from agent.engines.vllm.settings import ALLOWLIST, SWITCHES, VALUED
from agent.protocol.engine_args import MAX_ENGINE_ARGS, EngineArgsError
from tests.e2e.vllm import FLAGS as E2E_FLAGS

parse_engine_args = ENGINES["vllm"].parse_settings
engine_args_problem = ENGINES["vllm"].settings_problem
allowlist_markdown = ALLOWLIST.markdown



@pytest.mark.parametrize("args, problem", [
    ([], None),
    (E2E_FLAGS, None),  # the end-to-end tests' flags: a real deployment's, which must stay taken
    (["--enable-prefix-caching", "--quantization", "awq", "--seed=1"], None),
    (["--tool-call-parser"], "'--tool-call-parser' needs a value"),
    (["--tool-call-parser", "--enforce-eager"], "'--tool-call-parser' needs a value"),
    (["--enforce-eager=1"], "'--enforce-eager=1' is not one a deployment may set"),
    (["--trust-remote-code"], "'--trust-remote-code' is not one"),
    (["--load-format", "pt"], "'--load-format' is not one"),
    (["--api-key", "x"], "'--api-key' is not one"),
    (["--seed", "1\n2"], "engine argument 2 must be printable text"),
    (["--enforce-eager"] * (MAX_ENGINE_ARGS + 1), "at most 32 engine arguments"),
])
def test_engine_arguments_are_an_allowlist_and_a_refusal_names_the_argument(args, problem):
    found = engine_args_problem(args)
    assert found == problem if problem is None else problem in found


@pytest.mark.parametrize("args, problem", [
    # vLLM imports the file a plugin key or flag names, as the agent's user.
    (["--structured-outputs-config", '{"reasoning_parser_plugin": "/tmp/evil.py"}'],
     "'--structured-outputs-config': key 'reasoning_parser_plugin' is not one a deployment may set"),
    (["--structured-outputs-config", '{"backend": "xgrammar", "reasoning_parser_plugin": "/tmp/evil.py"}'],
     "key 'reasoning_parser_plugin' is not one"),
    (["--structured-outputs-config.reasoning_parser_plugin", "/tmp/evil.py"], "is not one a deployment may set"),
    (["--structured_outputs_config", '{"reasoning_parser_plugin": "/tmp/evil.py"}'], "is not one"),
    (["--tool-parser-plugin", "/tmp/evil.py"], "'--tool-parser-plugin' is not one"),
    (["--reasoning-parser-plugin", "/tmp/evil.py"], "'--reasoning-parser-plugin' is not one"),
    (["--io-processor-plugin", "evil"], "'--io-processor-plugin' is not one"),
    (["--logits-processors", "evil:Processor"], "'--logits-processors' is not one"),
    (["--worker-extension-cls", "evil.Worker"], "'--worker-extension-cls' is not one"),
    (["--chat-template", "/tmp/evil.jinja"], "'--chat-template' is not one"),
    (["--config", "/tmp/evil.yaml"], "'--config' is not one"),
    (["--hf-overrides", '{"auto_map": {}}'], "'--hf-overrides' is not one"),
    (["-q", "awq"], "'-q' is not one"),
    # A parser's name is a registered one, never a path.
    (["--tool-call-parser", "/tmp/evil.py"], "'--tool-call-parser' takes one of apertus"),
    (["--reasoning-parser", "evil"], "'--reasoning-parser' takes one of"),
    (["--structured-outputs-config", '{"reasoning_parser": "/tmp/evil.py"}'],
     "'reasoning_parser' takes one of --reasoning-parser's values"),
    (["--tokenizer-mode", "custom"], "'--tokenizer-mode' takes one of auto, hf"),
])
def test_nothing_that_names_a_file_or_module_vllm_imports_is_taken(args, problem):
    with pytest.raises(EngineArgsError) as e:
        parse_engine_args(args)
    assert problem in str(e.value)


@pytest.mark.parametrize("args, problem", [
    (["--max-num-seqs", "1e9"], "'--max-num-seqs' takes an integer from 1 to 1,024, not '1e9'"),
    (["--max-num-seqs=1000000000"], "'--max-num-seqs' takes an integer from 1 to 1,024"),
    (["--max-num-seqs", "0"], "from 1 to 1,024"),
    (["--max-num-seqs", "+8"], "from 1 to 1,024"),
    (["--max-num-seqs", "1_000"], "from 1 to 1,024"),
    (["--tensor-parallel-size", "64"], "'--tensor-parallel-size' takes an integer from 1 to 16, not '64'"),
    (["--pipeline-parallel-size", "64"], "'--pipeline-parallel-size' takes an integer from 1 to 16"),
    (["--tensor-parallel-size", "8", "--pipeline-parallel-size", "4"], "make 32 GPUs per replica; a replica spans "
                                                                       "at most 16"),
    (["--max-num-batched-tokens", "1k"], "'--max-num-batched-tokens' takes an integer from 1 to 131,072"),
    (["--max-logprobs", "-1"], "'--max-logprobs' needs a value"),
    (["--max-logprobs=-1"], "'--max-logprobs' takes an integer from 0 to 20"),
    (["--seed", "4294967296"], "'--seed' takes an integer from 0 to 4,294,967,295"),
    (["--cpu-offload-gb", "nan"], "'--cpu-offload-gb' takes a number from 0 to 1024"),
    (["--cpu-offload-gb", "1e3"], "a number from 0 to 1024"),
    (["--block-size", "7"], "'--block-size' takes one of 32, 64, 128"),
    (["--block-size", "16"], "'--block-size' takes one of 32, 64, 128"),  # vLLM's CPU build refuses it at start
    (["--kv-cache-dtype", "int3"], "'--kv-cache-dtype' takes one of auto"),
    (["--scheduling-policy", "lifo"], "'--scheduling-policy' takes one of fcfs, priority"),
    (["--generation-config", "/etc/../root"], "'--generation-config' takes 'auto' or 'vllm' or the absolute path"),
    (["--generation-config", "models/llama"], "the absolute path of a directory inside the model roots"),
    (["--structured-outputs-config", '{"backend": "evil"}'], "'backend' takes one of \"auto\", \"xgrammar\""),
    (["--structured-outputs-config", '{"disable_any_whitespace": "yes"}'],
     "'disable_any_whitespace' takes true or false"),
    (["--structured-outputs-config", '{"disable_any_whitespace": true}'], "needs \"backend\": \"xgrammar\""),
    (["--structured-outputs-config", '{"backend": "xgrammar", "backend": "guidance"}'], "key 'backend' is given twice"),
    (["--structured-outputs-config", '["xgrammar"]'], "takes a JSON object"),
    (["--override-generation-config", '{"temperature": 1e9}'], "'temperature' takes a number from 0 to 2"),
    (["--override-generation-config", '{"temperature": NaN}'], "is not valid JSON"),
    (["--override-generation-config", '{"max_new_tokens": 1.5}'], "'max_new_tokens' takes an integer from 1 to"),
    (["--override-generation-config", '{"max_new_tokens": true}'], "'max_new_tokens' takes an integer"),
    (["--override-generation-config", '{"logits_processor": "x"}'], "key 'logits_processor' is not one"),
    (["--enable-auto-tool-choice"], "'--enable-auto-tool-choice' needs '--tool-call-parser' beside it"),
    (["--max-num-seqs", "8", "--max-num-seqs=16"], "'--max-num-seqs' is given twice"),
    (["--enable-prefix-caching", "--no-enable-prefix-caching"], "given twice (or with its opposite)"),
    # Flags vLLM 0.32 no longer has: its parser would refuse them at every start.
    (["--disable-log-requests"], "'--disable-log-requests' is not one"),
    (["--swap-space", "4"], "'--swap-space' is not one"),
    (["--max-seq-len-to-capture", "8192"], "'--max-seq-len-to-capture' is not one"),
    (["--max-num-partial-prefills", "2"], "'--max-num-partial-prefills' is not one"),
])
def test_values_are_checked_against_what_each_flag_takes(args, problem):
    with pytest.raises(EngineArgsError) as e:
        parse_engine_args(args)
    assert problem in str(e.value)


def test_values_in_range_are_taken_as_vllm_reads_them():
    taken = parse_engine_args(["--max-num-seqs", "1024", "--cpu-offload-gb=2.5", "--kv-cache-dtype", "fp8",
                               "--override-generation-config", '{"temperature": 0.2, "top_k": 40}',
                               "--generation-config", "/models/llama/generation", "--no-enable-prefix-caching"])
    assert taken.values == {"--max-num-seqs": 1024, "--cpu-offload-gb": 2.5, "--kv-cache-dtype": "fp8",
                            "--override-generation-config": {"temperature": 0.2, "top_k": 40},
                            "--generation-config": "/models/llama/generation", "--no-enable-prefix-caching": True}
    assert taken.paths == (("--generation-config", "/models/llama/generation"),)  # the caller checks its roots
    assert parse_engine_args(["--generation-config", "vllm"]).paths == ()


def test_tensor_times_pipeline_parallelism_is_the_replicas_gpus():
    assert engine_args_problem(["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"], gpus=4) is None
    assert engine_args_problem(["--tensor-parallel-size", "4"], gpus=4) is None
    problem = engine_args_problem(["--tensor-parallel-size", "2"], gpus=1)
    assert "'--tensor-parallel-size' x '--pipeline-parallel-size' make 2 GPUs per replica; this deployment's " \
           "replicas have 1 (gpus_per_replica)" in problem
    assert "make 2 GPUs" in engine_args_problem(["--pipeline-parallel-size", "2"], gpus=4)
    assert engine_args_problem(["--max-num-seqs", "8"], gpus=4) is None  # set neither: vLLM's default, one GPU


def test_the_doc_table_lists_every_flag_with_what_it_takes():
    table = allowlist_markdown()
    for flag in [*SWITCHES, *VALUED]:
        assert f"| `{flag}` |" in table
    assert "| `--max-num-seqs` | an integer from 1 to 1,024 |" in table
