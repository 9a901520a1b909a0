"""`make bench`'s shapes fit the model they run on (256 positions), each is sent by one tool, and GuideLLM's
scenario carries the API key in the file, for the shapes GuideLLM runs."""

import json

import pytest

from bench.standard.shapes import COLD, DRIVER, GUIDELLM, SHAPES, scenario, seconds_per_shape

POSITIONS = 256  # build_tiny_llama_64's max_position_embeddings
CHAT_TEMPLATE_PER_MESSAGE = 8  # role markers and separators of the demo tokenizer's template, generously


def longest_sequence(shape) -> int:
    data = shape.data or {"prompt_tokens": shape.prompt_tokens, "output_tokens": shape.output_tokens}
    prefix = max((b["prefix_tokens"] for b in data.get("prefix_buckets", ())), default=0)
    turns = data.get("turns", 1)
    messages = 2 * turns - 1 if turns > 1 else 0
    # the last turn resends every earlier prompt and answer
    return prefix + turns * data["prompt_tokens"] + turns * data["output_tokens"] + messages * CHAT_TEMPLATE_PER_MESSAGE


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_every_shape_fits_the_models_positions(shape):
    assert longest_sequence(shape) < POSITIONS


def test_the_standard_shapes_are_all_there_each_sent_by_one_tool():
    names = [s.name for s in SHAPES]
    assert len(set(names)) == len(names) == 5
    assert {s.tool for s in SHAPES} == {GUIDELLM, DRIVER}
    assert next(s for s in SHAPES if s.name == COLD).tool == DRIVER
    multi = next(s for s in SHAPES if s.data.get("turns", 1) > 1)
    assert multi.request_format == "/v1/chat/completions"  # turns are a chat's history
    assert any(s.data.get("prefix_buckets") for s in SHAPES)


def test_a_guidellm_scenario_names_the_target_model_key_and_tokenizer():
    shape = next(s for s in SHAPES if s.data.get("prefix_buckets"))
    made = scenario(shape, target="http://127.0.0.1:9", model="bench-vllm", api_key="k3y", tokenizer="/m",
                    seconds=7.0)
    spec = json.loads(json.dumps(made))["spec"]  # what is written to the file
    assert spec["backend"]["api_key"] == "k3y"
    assert (spec["backend"]["target"], spec["backend"]["model"]) == ("http://127.0.0.1:9", "bench-vllm")
    assert spec["constraints"] == [{"kind": "max_duration", "seconds": 7.0}]
    assert spec["profile"] == {"kind": "concurrent", "streams": shape.streams}
    assert spec["data"][0]["kind"] == "synthetic_text" and spec["data"][0]["prefix_buckets"] == shape.data[
        "prefix_buckets"]
    assert spec["tokenizer"] == {"kind": "hf_auto", "model": "/m"}


def test_a_driven_shape_has_no_guidellm_scenario():
    with pytest.raises(ValueError, match="driver"):
        scenario(next(s for s in SHAPES if s.tool == DRIVER), target="t", model="m", api_key="k", tokenizer="/m",
                 seconds=1)


def test_quick_runs_shorter():
    assert seconds_per_shape(True) < seconds_per_shape(False)
