"""A model's shape as the capability checks read it: facts that cannot be read are None, never an error."""

import json

from agent.artifacts import inspect_model_dir
from agent.artifacts.capability import model_shape
from agent.artifacts.capability.shape import head_dim, tokenizer_ids
from agent.artifacts.config import ModelConfig
from tests.conftest import write_model_dir


def test_an_explicit_head_dim_wins_and_gpt2_names_its_own_fields(tmp_path):
    path = write_model_dir(tmp_path / "m", hidden=64)
    config = json.loads((path / "config.json").read_text())
    assert model_shape(inspect_model_dir(path)).head_dim == 16
    (path / "config.json").write_text(json.dumps(config | {"head_dim": 32}))
    assert model_shape(inspect_model_dir(path)).head_dim == 32
    assert head_dim(ModelConfig({"model_type": "gpt2", "n_embd": 768, "n_head": 12})) == 64


def test_a_tokenizer_that_cannot_be_read_tells_nothing(tmp_path):
    path = write_model_dir(tmp_path / "m")
    assert tokenizer_ids(path) is None  # none at all
    (path / "tokenizer.json").write_text("{not json")
    assert tokenizer_ids(path) is None
    (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]] * 7}}))
    assert tokenizer_ids(path) == 7
