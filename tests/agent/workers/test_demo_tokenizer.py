"""The offline tokenizers written beside the tiny demo models."""

import hashlib

from tokenizers import Tokenizer

from agent.workers.demo_tokenizer import VOCAB_SIZE, write_bert_tokenizer, write_llama_tokenizer

TEXT = "Hello world, ModelGrid serves models!"


def test_the_llama_tokenizer_fits_the_vocab_adds_bos_and_round_trips(tmp_path):
    tokenizer = Tokenizer.from_file(str(write_llama_tokenizer(tmp_path) / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= VOCAB_SIZE
    assert [tokenizer.token_to_id(t) for t in ("<unk>", "<s>", "</s>")] == [0, 1, 2]  # LlamaConfig's ids
    ids = tokenizer.encode(TEXT).ids
    assert ids[0] == 1 and max(ids) < VOCAB_SIZE and 0 not in ids  # byte-level: nothing is unknown
    assert tokenizer.decode(ids) == TEXT


def test_the_bert_tokenizer_wraps_text_in_cls_and_sep(tmp_path):
    tokenizer = Tokenizer.from_file(str(write_bert_tokenizer(tmp_path) / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= VOCAB_SIZE
    encoding = tokenizer.encode(TEXT)
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]" and "[UNK]" not in encoding.tokens
    assert tokenizer.token_to_id("[PAD]") == 0


def test_transformers_loads_them_with_the_same_ids(tmp_path):
    from transformers import AutoTokenizer

    for write in (write_llama_tokenizer, write_bert_tokenizer):
        path = write(tmp_path / write.__name__)
        assert AutoTokenizer.from_pretrained(path).encode(TEXT) == Tokenizer.from_file(
            str(path / "tokenizer.json")
        ).encode(TEXT).ids


def test_training_is_deterministic(tmp_path):
    digests = {
        hashlib.sha256((write_llama_tokenizer(tmp_path / name) / "tokenizer.json").read_bytes()).hexdigest()
        for name in ("a", "b")
    }
    assert len(digests) == 1
