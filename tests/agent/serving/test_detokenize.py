"""Streaming detokenization: the text released token by token equals the whole decode, and stop strings
never leak out (torch-free; a real BPE tokenizer)."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from agent.serving.detokenize import TextStream

TEXT = "Grüße aus Zürich — naïve café déjà vu. The quick brown fox jumps over the lazy dog! 你好世界"


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([TEXT] * 3, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def stream(tokenizer, ids, stops=()):
    text = TextStream(tokenizer, stops)
    pieces = [text.push(i) for i in ids]
    pieces.append(text.finish())
    return pieces, text


def test_the_pieces_add_up_to_the_whole_decode_and_never_split_a_character(tokenizer):
    ids = tokenizer.encode(TEXT).ids
    pieces, text = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text.text
    assert not any("\ufffd" in piece for piece in pieces)


def test_a_stop_string_ends_the_text_before_it_and_is_never_released(tokenizer):
    ids = tokenizer.encode(TEXT).ids
    pieces, text = stream(tokenizer, ids, stops=["fox", "zzz"])
    assert "".join(pieces) == TEXT[: TEXT.index("fox")] == text.text
    assert text.stopped
    assert text.push(ids[-1]) == "" and text.finish() == ""  # nothing more once stopped


def test_text_that_may_start_a_stop_string_waits_then_flows_when_it_does_not(tokenizer):
    ids = tokenizer.encode("café déjà").ids
    text = TextStream(tokenizer, ["é!"])
    released = "".join(text.push(i) for i in ids)
    assert not released.endswith("é")  # held: the next token could have been "!"
    assert released + text.finish() == "café déjà"
    assert not text.stopped
