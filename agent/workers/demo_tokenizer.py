"""Tokenizers for the tiny demo models, trained offline on a built-in text so their vocabularies fit 1024 ids.

tiny-llama gets a byte-level BPE (`<unk>` 0, `<s>` 1, `</s>` 2, as LlamaConfig's defaults expect);
tiny-bert a lower-cased WordPiece (`[PAD]` 0, `[UNK]` 1, `[CLS]` 2, `[SEP]` 3, `[MASK]` 4).
Both are saved as tokenizer.json plus tokenizer_config.json, which transformers' AutoTokenizer loads;
tiny-llama's tokenizer_config.json also holds a Zephyr-style chat template, so /v1/chat/completions works on it.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

VOCAB_SIZE = 1024  # the tiny demo models' vocab_size
MAX_LENGTH = 256  # their max_position_embeddings

# Zephyr's layout with Llama's real special tokens: `<s>` once, then `<|role|>`, a newline, the text and `</s>` per
# message, and an open `<|assistant|>` turn; the model's eos_token_id (2, `</s>`) ends its answer.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Plain English about what the demo serves, repeated in training so frequent words become single tokens.
CORPUS = """\
ModelGrid serves many models on shared GPUs. A console decides where each model runs, and an agent on
every host starts one worker process per replica, loads the weights, and answers inference requests.
The quick brown fox jumps over the lazy dog. Hello world, hello model, hello again.
When traffic moves, models are switched in and out: a replica can be ready, sleeping or stopped.
Sleeping replicas keep their weights in host memory and wake in well under a second.
One base model can serve many adapters; a batch may mix adapters in a single forward pass.
Requests wait in a queue for a few milliseconds so that several of them share one batch.
Embeddings turn a sentence into a vector; completions continue a prompt one token at a time.
The scheduler keeps the most important models inside their latency targets and reports why it decides.
Memory is estimated before loading, reserved while placing, measured after loading, and learned over time.
Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 and words like GPU, CPU, RAM, HTTP and JSON appear too.
What is the weather like today? It is sunny and warm, with a light wind from the west.
Once upon a time there was a small model that wanted to answer every question it was asked.
"""


def train_bpe() -> Tokenizer:
    """A byte-level BPE with Llama's special tokens; encoding adds `<s>` in front."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any text encodes, never <unk>
        show_progress=False,
    )
    tokenizer.train_from_iterator(_lines(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    return tokenizer


def train_wordpiece() -> Tokenizer:
    """A lower-cased WordPiece with BERT's special tokens; encoding wraps text in `[CLS] ... [SEP]`."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        initial_alphabet=list(string.printable.strip()),  # punctuation the text lacks is not [UNK]
        show_progress=False,
    )
    tokenizer.train_from_iterator(_lines(), trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tokenizer


def write_llama_tokenizer(directory: str | Path) -> Path:
    """Save the BPE tokenizer, with its chat template, beside a tiny Llama."""
    return _save(
        train_bpe(),
        directory,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )


def write_bert_tokenizer(directory: str | Path) -> Path:
    """Save the WordPiece tokenizer beside a tiny BERT."""
    return _save(
        train_wordpiece(),
        directory,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def has_current_chat_template(directory: str | Path) -> bool:
    """Whether the tiny-llama tokenizer in `directory` carries this version's chat template (older runs wrote none)."""
    try:
        config = json.loads((Path(directory) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("chat_template") == CHAT_TEMPLATE


def _save(tokenizer: Tokenizer, directory: str | Path, **special: str) -> Path:
    # transformers writes tokenizer_config.json (special tokens, max length) in the form AutoTokenizer reads;
    # save_jinja_files=False keeps the chat template in it rather than in a chat_template.jinja beside it.
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=MAX_LENGTH, **special)
    fast.save_pretrained(str(directory), save_jinja_files=False)
    return directory


def _lines() -> list[str]:
    return CORPUS.splitlines() * 4
