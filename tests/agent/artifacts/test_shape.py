"""A model's serving shape is read from config.json whatever the family calls its sizes, and compared fact by fact."""

from agent.artifacts import read_model_dir
from agent.artifacts.shape import serving_shape, shape_changes
from tests.agent.artifacts.test_config_consistency import DISTILBERT, GPT2, LLAMA, write


def test_each_family_s_names_for_its_sizes_give_one_shape(tmp_path):
    shapes = {name: serving_shape(read_model_dir(write(tmp_path / name, config)))
              for name, config in (("llama", LLAMA), ("gpt2", GPT2), ("distilbert", DISTILBERT))}
    assert shapes["llama"] == {"format": "safetensors", "architecture": "LlamaForCausalLM", "task": "causal-lm",
                               "hidden_size": 16, "vocab_size": 32, "layers": 1}
    assert shapes["gpt2"] | {"architecture": ""} == {"format": "safetensors", "architecture": "", "task": "causal-lm",
                                                     "hidden_size": 16, "vocab_size": 32, "layers": 1}
    assert (shapes["distilbert"]["task"], shapes["distilbert"]["hidden_size"]) == ("encoder", 16)


def test_only_the_facts_both_sides_state_are_compared():
    was = {"architecture": "LlamaForCausalLM", "task": "causal-lm"}  # a row stored before sizes were
    now = {"architecture": "LlamaForCausalLM", "task": "encoder", "hidden_size": 32, "vocab_size": 8, "layers": 2}
    assert shape_changes(was, now) == ["task causal-lm -> encoder"]
    assert shape_changes(now, now | {"layers": 3, "hidden_size": None}) == ["layers 2 -> 3"]
