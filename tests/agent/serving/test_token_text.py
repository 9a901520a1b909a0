"""A token on its own, as log probabilities show it (agent.serving.detokenize.token_text), and where each prompt token
starts in the prompt's text (text_offsets): for a byte-level BPE, a SentencePiece-style tokenizer with byte fallback,
and ids past the tokenizer's vocabulary (torch-free)."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from agent.serving.detokenize import text_offsets, token_text
from agent.serving.tokenization import TextCodec
from agent.workers.demo_tokenizer import train_bpe


def sentencepiece_like():
    """Llama-2's layout: "▁" for spaces, <0xNN> pieces for bytes the vocabulary lacks."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{byte:02X}>": 3 + byte for byte in range(256)})
    for piece in ("▁", "t", "h", "e", "th", "the", "▁the", "▁a", "a"):
        vocab[piece] = len(vocab)
    merges = [("t", "h"), ("th", "e"), ("▁", "the"), ("▁", "a")]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    return TextCodec(tokenizer, 64, truncate=False)


def shown(codec, token_id):
    return token_text(token_id, codec.token_text(token_id), codec.token_piece(token_id))


@pytest.fixture(scope="module")
def bpe():
    return TextCodec(train_bpe(), 256, truncate=False)


def test_byte_level_pieces_of_one_character_show_their_own_bytes(bpe):
    ids = bpe.encode_plain("ü")  # two byte-level pieces, "Ã" (0xC3) and "¼" (0xBC)
    texts = [shown(bpe, i) for i in ids]
    assert [t.text for t in texts] == ["\ufffd", "\ufffd"]
    assert [t.raw for t in texts] == [b"\xc3", b"\xbc"] and not any(t.whole for t in texts)
    assert [t.escaped() for t in texts] == ["\\xc3", "\\xbc"]


def test_a_whole_token_is_its_text(bpe):
    [the] = bpe.encode_plain(" the")
    assert shown(bpe, the).text == " the" and shown(bpe, the).raw == b" the" and shown(bpe, the).whole


def test_byte_fallback_pieces_show_their_bytes_and_sentencepiece_keeps_its_leading_space():
    codec = sentencepiece_like()
    ids = codec.encode_plain("é the")
    assert [codec.token_piece(i) for i in ids] == ["▁", "<0xC3>", "<0xA9>", "▁the"]
    assert [shown(codec, i).raw for i in ids] == [b" ", b"\xc3", b"\xa9", b" the"]
    assert [shown(codec, i).whole for i in ids] == [True, False, False, True]
    # Decoded alone, "▁the" loses its space and would look like "the".
    spaced, bare = codec.encode_plain("the")[0], codec.encode_plain("xthe")[-1]
    assert (codec.token_piece(spaced), codec.token_piece(bare)) == ("▁the", "the")
    assert (codec.token_text(spaced), codec.token_text(bare)) == ("the", "the")
    assert (shown(codec, spaced).text, shown(codec, bare).text) == (" the", "the")


def test_an_id_the_tokenizer_lacks_is_named_by_its_id(bpe):
    missing = bpe.token_piece(5000)
    assert missing is None
    assert shown(bpe, 5000).text == "token_id:5000" and shown(bpe, 5000).raw is None and shown(bpe, 5000).whole


def test_each_prompt_token_starts_where_its_text_does(bpe):
    ids = bpe.encode(["Grüße the fox"])[0]  # <s> first, and ü and ß in two pieces each
    text, starts = text_offsets(bpe, ids)
    assert text == "Grüße the fox"
    assert len(starts) == len(ids) and starts[0] == starts[1] == 0  # <s> has no text
    assert starts == sorted(starts)
    for token_id, start in zip(ids, starts, strict=True):
        piece = shown(bpe, token_id)
        if piece.whole and piece.text != "<s>":
            assert text[start:].startswith(piece.text)
    halves = [start for token_id, start in zip(ids, starts, strict=True) if not shown(bpe, token_id).whole]
    assert halves == [2, 2, 3, 3]  # both pieces of a character start where it does
