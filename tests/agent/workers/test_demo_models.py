import hashlib

from agent.artifacts import inspect_model_dir
from agent.workers.demo_models import build_tiny_llama, write_demo_models


def digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_it_writes_the_three_demo_models_and_skips_them_the_second_time(tmp_path):
    lines = []
    written = write_demo_models(tmp_path / "models", log=lines.append)
    assert [p.name for p in written] == ["tiny-llama", "tiny-bert", "minilm"]
    tasks = {p.name: inspect_model_dir(p) for p in written}
    assert tasks["tiny-llama"].task == "causal-lm" and tasks["tiny-llama"].architecture == "LlamaForCausalLM"
    assert tasks["tiny-bert"].task == "encoder" and tasks["minilm"].task == "encoder"
    assert sorted(f.name for f in written[2].iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert all(line.endswith("MB)") for line in lines)
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]  # no leftovers

    lines.clear()
    write_demo_models(tmp_path / "models", log=lines.append)
    assert lines == [f"{p}: already present, skipped" for p in written]


def test_the_tiny_llama_is_deterministic(tmp_path):
    assert digest(build_tiny_llama(tmp_path / "a")) == digest(build_tiny_llama(tmp_path / "b"))
