"""The engine-argument allowlist stays inside what vLLM takes: vLLM's real argument parser (its OpenAI server's,
with the serve-args checks it runs before it starts), in the vLLM environment's interpreter, over a table of
samples. Every sample the allowlist takes, vLLM's parser takes too; the known-bad ones are refused by both; and the
allowlist's choices are among vLLM's own (its parser's choices, its parser registries, its config literals).

One subprocess (vLLM's parser imports torch: 10-40 s here); skipped without MODELGRID_VLLM_PYTHON, and on the
suite's PostgreSQL pass (the parser does not care which database runs)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent.engines import ENGINES
from agent.engines.vllm.settings import (
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    REASONING_PARSERS,
    STRUCTURED_OUTPUT_BACKENDS,
    SWITCHES,
    TOKENIZER_MODES,
    TOOL_CALL_PARSERS,
    VALUED,
)
from agent.protocol.engine_args.kinds import Choice, Float, Int, JsonObject, ModelDir

engine_args_problem = ENGINES["vllm"].settings_problem
VLLM_PYTHON = os.environ.get("MODELGRID_VLLM_PYTHON", "")
pytestmark = [
    pytest.mark.skipif(not VLLM_PYTHON or not Path(VLLM_PYTHON).exists(),
                       reason="no vLLM environment (make vllm, then MODELGRID_VLLM_PYTHON=.venv-vllm/bin/python)"),
    pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"),
                       reason="runs once, in the SQLite pass: vLLM's parser does not depend on the database"),
]
# What agent.engines.vllm.launch puts before a deployment's flags (the worker adds the port).
BASE = ["--model", "/models/llama", "--served-model-name", "chat", "--host", "127.0.0.1", "--dtype", "float32",
        "--disable-uvicorn-access-log", "--max-model-len", "512", "--port", "8000"]
JSON_SAMPLES = {
    "--structured-outputs-config": [
        {"backend": "xgrammar", "disable_any_whitespace": True},
        {"backend": "guidance", "disable_any_whitespace": False, "disable_additional_properties": True},
        {"backend": "auto", "reasoning_parser": "qwen3", "enable_in_reasoning": True},
        {"backend": "outlines", "reasoning_parser": ""},
        {"backend": "lm-format-enforcer"},
        {},
    ],
    "--override-generation-config": [
        {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
         "presence_penalty": -2, "frequency_penalty": 2, "max_new_tokens": 512},
        {"top_k": -1},
    ],
}
# Refused by both: vLLM's parser or its serve-args checks would stop the replica at every start.
KNOWN_BAD = [
    ["--max-num-seqs", "1e9"],
    ["--max-num-batched-tokens", "lots"],
    ["--seed", "x"],
    ["--block-size", "sixteen"],
    ["--cpu-offload-gb", "abc"],
    ["--kv-cache-dtype", "int3"],
    ["--scheduling-policy", "lifo"],
    ["--logprobs-mode", "logits"],
    ["--chat-template-content-format", "xml"],
    ["--structured-outputs-config", '{"backend": "evil"}'],
    ["--structured-outputs-config", '{"disable_any_whitespace": true}'],
    ["--structured-outputs-config", '{"backend": "xgrammar", "disable_additional_properties": true}'],
    ["--structured-outputs-config", "not json"],
    ["--structured-outputs-config", '{"no_such_key": 1}'],
    ["--enable-auto-tool-choice"],
    ["--tool-call-parser"],
    ["--enforce-eager=1"],
    ["--disable-log-requests"],
    ["--swap-space", "4"],
    ["--max-seq-len-to-capture", "8192"],
    ["--max-num-partial-prefills", "2"],
]
# Run in vLLM's interpreter: parse each sample after BASE; print [[taken, why], ...] and vLLM's own choices.
SCRIPT = r"""
import contextlib, io, json, sys, typing
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.tool_parsers import ToolParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
from vllm.config.model import TokenizerMode
from vllm.config.structured_outputs import StructuredOutputsBackend

base, samples = json.loads(sys.stdin.read())
parser = make_arg_parser(FlexibleArgumentParser())
results = []
for sample in samples:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            validate_parsed_serve_args(parser.parse_args(base + sample))
        results.append([True, ""])
    except SystemExit:
        results.append([False, (err.getvalue().strip().splitlines() or ["exit"])[-1]])
    except Exception as e:
        results.append([False, f"{type(e).__name__}: {e}"])
choices = {a.option_strings[0]: [str(c) for c in a.choices] for a in parser._actions
           if a.option_strings and a.choices is not None}
print(json.dumps({"results": results, "choices": choices,
                  "tool_call_parsers": sorted(ToolParserManager.list_registered()),
                  "reasoning_parsers": sorted(ReasoningParserManager.list_registered()),
                  "quantizations": list(QUANTIZATION_METHODS), "tokenizer_modes": list(typing.get_args(TokenizerMode)),
                  "structured_output_backends": list(typing.get_args(StructuredOutputsBackend))}))
"""


def taken_samples() -> list[list[str]]:
    """Samples the allowlist takes: every switch, and each valued flag at its bounds, with each of its choices, in
    both spellings (`--flag value` and `--flag=value`)."""
    samples = [[switch, *(a for need in needs for a in (need, "hermes"))] for switch, needs in SWITCHES.items()]
    for flag, kind in VALUED.items():
        if isinstance(kind, Int):
            values = [str(kind.low), str(kind.high)]
        elif isinstance(kind, Float):
            values = [f"{kind.low:g}", "2.5", f"{kind.high:g}"]
        elif isinstance(kind, Choice):
            values = list(kind.values)
        elif isinstance(kind, ModelDir):
            values = [*kind.keywords, "/models/llama/generation"]
        else:
            assert isinstance(kind, JsonObject)
            values = [json.dumps(v) for v in JSON_SAMPLES[flag]]
        samples += [[flag, value] for value in values] + [[f"{flag}={values[-1]}"]]
    samples.append(["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--max-num-seqs", "64",
                    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--structured-outputs-config",
                    '{"backend": "xgrammar", "disable_any_whitespace": true}'])
    return samples


@pytest.fixture(scope="module")
def vllm_says():
    taken = taken_samples()
    run = subprocess.run([VLLM_PYTHON, "-c", SCRIPT], input=json.dumps([BASE, taken + KNOWN_BAD]),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    return dict(zip(map(tuple, taken + KNOWN_BAD), said.pop("results"), strict=True)), said


def test_every_sample_the_allowlist_takes_vllms_parser_takes_too(vllm_says):
    results, _ = vllm_says
    for sample in taken_samples():
        assert engine_args_problem(sample) is None, sample
        taken, why = results[tuple(sample)]
        assert taken, f"vLLM refuses {sample}, which the allowlist takes: {why}"


def test_the_known_bad_samples_are_refused_by_both(vllm_says):
    results, _ = vllm_says
    for sample in KNOWN_BAD:
        assert engine_args_problem(sample) is not None, sample
        taken, _why = results[tuple(sample)]
        assert not taken, f"vLLM's parser takes {sample}: move it out of KNOWN_BAD (the allowlist still refuses it)"


def test_the_allowlists_choices_are_vllms_own(vllm_says):
    _, said = vllm_says
    assert set(TOOL_CALL_PARSERS) <= set(said["tool_call_parsers"])
    assert set(REASONING_PARSERS) <= set(said["reasoning_parsers"])
    assert set(QUANTIZATIONS) <= set(said["quantizations"])
    assert set(TOKENIZER_MODES) <= set(said["tokenizer_modes"])
    assert set(STRUCTURED_OUTPUT_BACKENDS) <= set(said["structured_output_backends"])
    assert set(KV_CACHE_DTYPES) <= set(said["choices"]["--kv-cache-dtype"])
    for flag, kind in VALUED.items():
        if isinstance(kind, Choice) and flag in said["choices"]:
            assert set(kind.values) <= set(said["choices"][flag]), flag
