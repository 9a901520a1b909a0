"""The models bench/generation.py serves, built offline from seeded configs (imports torch and transformers).

tiny-llama is the demo model (agent.workers.demo_models). The decoder is a Llama of a size given by its
shape (~270M parameters by default, ~1.1B with `big=True` for GPU runs) with seed-0 random weights, saved as
safetensors with a word-level tokenizer of exactly its vocabulary: every id decodes to a distinct word, so
two texts are equal exactly when their tokens are. Adapters are PEFT-layout LoRA directories written the way
the tests write them (tests/adapter_files.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from agent.workers.demo_tokenizer import CORPUS
from tests.adapter_files import write_adapter

SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: LlamaConfig's default unk/bos/eos


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 32000
    positions: int = 2048

    def config(self) -> transformers.LlamaConfig:
        return transformers.LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.hidden, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            intermediate_size=self.intermediate, max_position_embeddings=self.positions,
        )


# ~271M parameters: a size two CPU cores decode at a few tokens a second per stream.
DECODER_270M = DecoderShape(hidden=1024, layers=16, heads=16, kv_heads=16, intermediate=2816)
# ~117M parameters (the 270M decoder's layers, 4 of them): for --quick, which builds and loads it in seconds.
DECODER_QUICK = DecoderShape(hidden=1024, layers=4, heads=16, kv_heads=16, intermediate=2816)
# ~1.1B parameters, TinyLlama-1.1B's shape: for GPU runs (--big-layers).
DECODER_1B = DecoderShape(hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632)


def build_decoder(directory: Path, shape: DecoderShape) -> int:
    """Save a seed-0 random Llama of `shape` (float32 safetensors) and its tokenizer; returns its parameter count.

    Matrices are uniform with transformers' initializer std (0.02) and norms are ones: the same statistics as
    its own initialisation, which takes 17 s for 270M parameters on this machine's core (normal_ is slow)."""
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(shape.config())
    model = model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    bound = 0.02 * 3**0.5  # uniform(-b, b) has std b / sqrt(3)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.fill_(1.0)
            else:
                parameter.uniform_(-bound, bound, generator=generator)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory, safe_serialization=True)
    del model
    write_word_tokenizer(directory, shape.vocab, shape.positions)
    return params


def corpus_words() -> list[str]:
    """The demo corpus's words and punctuation, in order of first appearance."""
    return list(dict.fromkeys(re.findall(r"\w+|[^\w\s]", CORPUS)))


def write_word_tokenizer(directory: Path, vocab_size: int, max_length: int) -> Path:
    """A word-level tokenizer with exactly `vocab_size` ids: the specials, the demo corpus's words, then
    filler words `w<id>`; encoding adds `<s>` in front, decoding joins words with spaces."""
    from transformers import PreTrainedTokenizerFast

    words = [*SPECIALS, *corpus_words()]
    words += [f"w{i}" for i in range(len(words), vocab_size)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert tokenizer.get_vocab_size() == vocab_size
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length, bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    fast.save_pretrained(str(directory))
    return directory


def lora_modules(config_path: Path, rank: int) -> dict[str, tuple[int, int, int]]:
    """(rank, in, out) of q_proj and up_proj in every layer of the Llama whose config.json is given."""
    config = json.loads(config_path.read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    modules = {}
    for i in range(config["num_hidden_layers"]):
        modules[f"model.layers.{i}.self_attn.q_proj"] = (rank, hidden, heads * head_dim)
        modules[f"model.layers.{i}.mlp.up_proj"] = (rank, hidden, inter)
    return modules


def write_adapters(directory: Path, model_dir: Path, names: list[str], rank: int = 8) -> dict[str, Path]:
    """One seeded LoRA adapter per name (seeds 1, 2, ...), each changing the base model's output."""
    modules = lora_modules(model_dir / "config.json", rank)
    return {name: write_adapter(directory / name, modules, seed=seed, r=rank, lora_alpha=2 * rank,
                                target_modules=["q_proj", "up_proj"])
            for seed, name in enumerate(names, start=1)}
