"""The engines' registry: every engine behind the one interface, looked up by name, and the behaviours callers ask
of it instead of comparing names."""

from importlib import metadata

import pytest

from agent import engines
from agent.engines import AUTO, BUILTIN, ENGINES, Engine, auto_engine, available, choices, get, parse_settings
from agent.protocol import BUILTIN_ENGINE
from agent.protocol.engine_args import EngineArgsError


def test_every_engine_implements_the_interface_under_its_own_name():
    assert all(isinstance(e, Engine) and name == e.name for name, e in ENGINES.items())
    assert BUILTIN.name == BUILTIN_ENGINE and BUILTIN.in_worker
    assert get("") is get(None) is BUILTIN
    with pytest.raises(KeyError):
        get("nope")


def test_the_deployment_choices_are_auto_then_every_engine():
    assert choices() == [(AUTO, AUTO), *((e.name, e.label) for e in ENGINES.values())]


def test_auto_picks_an_engine_that_wants_the_model_and_does_not_refuse_it_else_the_built_in_one():
    assert auto_engine({"torch", "vllm"}, "causal-lm", real_gpus=True) == "vllm"
    assert auto_engine({"torch", "vllm"}, "causal-lm", real_gpus=False) == BUILTIN.name
    assert auto_engine({"torch", "vllm"}, "encoder", real_gpus=True) == BUILTIN.name
    assert auto_engine({"torch"}, "causal-lm", real_gpus=True) == BUILTIN.name
    refused = {"vllm": {"cuda": "no"}}
    assert auto_engine({"torch", "vllm"}, "causal-lm", real_gpus=True, refused=refused) == BUILTIN.name


def test_settings_are_checked_against_the_engine_or_for_auto_against_those_that_take_some():
    assert parse_settings("vllm", ["--enforce-eager"]).values == {"--enforce-eager": True}
    assert parse_settings(AUTO, ["--enforce-eager"]).values == {"--enforce-eager": True}
    assert parse_settings(AUTO, ["--ctx-size", "512"]).values == {"--ctx-size": 512}  # llama.cpp's, whole
    with pytest.raises(EngineArgsError, match="'--trust-remote-code' is not one"):
        parse_settings(AUTO, ["--trust-remote-code"])
    with pytest.raises(EngineArgsError, match="'--ctx-size' is not one"):  # no engine takes the two together
        parse_settings(AUTO, ["--enforce-eager", "--ctx-size", "512"])
    assert BUILTIN.settings_problem(["--enforce-eager"]) == f"engine {BUILTIN.name} takes no engine arguments"


def test_a_host_runs_the_built_in_engine_beside_torch_and_another_only_where_its_program_is_given():
    assert available({}) == [(BUILTIN.name, metadata.version("torch")[:50])]
    assert engines.ENGINES["vllm"].version(None) == ""


def test_callers_ask_the_engine_what_it_does():
    vllm = ENGINES["vllm"]
    assert (vllm.in_worker, vllm.passes_openai_bodies, vllm.relays_metrics, vllm.starts_one_per_gpu) == \
        (False, True, True, True)
    assert (vllm.sleeps_on("cpu"), vllm.sleeps_on("cuda"), BUILTIN.sleeps_on("cpu")) == (False, True, True)
    assert vllm.program is not None and vllm.program.flag == "--vllm-python" and BUILTIN.program is None
    assert vllm.failure_reason(["Traceback (most recent call last):", '  File "x.py", line 1',
                                "ValueError: no room"]) == "ValueError: no room"
    assert vllm.adapter_restart_reason("chat", [], 8) == "the vLLM servers of deployment chat started without LoRA"
    assert vllm.adapter_restart_reason("chat", [8], 16) == \
        "the vLLM servers of deployment chat serve LoRA ranks up to 8"
    assert vllm.adapter_restart_reason("chat", [16], 8) == "" == BUILTIN.adapter_restart_reason("chat", [], 8)
