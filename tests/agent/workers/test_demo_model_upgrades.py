"""Demo models written by an older version get this version's tokenizer files, weights untouched."""

import json

from agent.serving.chat import ChatTemplates
from agent.workers.demo_models import write_demo_models
from agent.workers.demo_tokenizer import CHAT_TEMPLATE, write_llama_tokenizer


def present(directory, *files):
    """A demo model directory as the presence check sees one (the weights' bytes are never read)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "model.safetensors", *files):
        if not (directory / name).exists():
            (directory / name).write_text("{}")
    return directory


def test_an_older_tiny_llama_gets_the_chat_template_and_keeps_its_weights(tmp_path):
    root = tmp_path / "models"
    llama = root / "tiny-llama"
    write_llama_tokenizer(llama)
    config_file = llama / "tokenizer_config.json"
    older = {k: v for k, v in json.loads(config_file.read_text()).items() if k != "chat_template"}
    config_file.write_text(json.dumps(older))  # what versions before chat templates wrote
    tokenizer = (llama / "tokenizer.json").read_bytes()
    present(llama)
    (llama / "model.safetensors").write_bytes(b"older weights")
    present(root / "tiny-bert")
    present(root / "minilm")

    lines = []
    write_demo_models(root, log=lines.append)
    assert lines == [
        f"{llama}: already present, tokenizer files refreshed (chat template added)",
        f"{root / 'tiny-bert'}: already present, skipped",
        f"{root / 'minilm'}: already present, skipped",
    ]
    assert json.loads(config_file.read_text())["chat_template"] == CHAT_TEMPLATE
    assert (llama / "tokenizer.json").read_bytes() == tokenizer  # the same vocabulary: the weights still fit
    assert (llama / "model.safetensors").read_bytes() == b"older weights"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no leftovers
    assert ChatTemplates().render(str(llama), [{"role": "user", "content": "hi"}]).endswith("<|assistant|>\n")

    lines.clear()
    write_demo_models(root, log=lines.append)
    assert lines[0] == f"{llama}: already present, skipped"
