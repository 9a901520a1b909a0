"""Token ids to text as they stream in, with OpenAI's stop strings (torch-free).

A token's text can still change when the next one arrives (a multi-byte character split over two tokens,
a word-piece that merges), and text that may be the start of a stop string must not be sent before the
stop is ruled out. So text is released only once it is settled: each new token is decoded together with a
few tokens before it (the offsets technique of Hugging Face's text-generation-inference), and the tail
that could begin a stop string is held back until the next token or the end.

For log probabilities a token is also shown on its own (TokenText): a token that holds only part of a
character decodes to U+FFFD, so its own bytes are read from its vocabulary piece, and clients see them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

METASPACE = "\u2581"  # SentencePiece's "▁", a space in its pieces
BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's piece for one raw byte


class Decoder(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class TextStream:
    """One sequence's text. `push` each token and send what it returns; `finish` at the end for the rest.
    After a stop string appears, `stopped` is set, `text` ends before it and nothing more is released."""

    def __init__(self, decoder: Decoder, stops: Sequence[str] = ()) -> None:
        self._decoder = decoder
        self._stops = [s for s in stops if s]
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] is the context the newest ids are decoded with
        self._read = 0
        self._sent = 0  # characters of `text` released so far
        self.text = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(token_id)
        self._settle(final=False)
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self._settle(final=True)
        return self._release(final=True)

    def _settle(self, final: bool) -> None:
        before = self._decoder.decode(self._ids[self._prefix : self._read])
        after = self._decoder.decode(self._ids[self._prefix :])
        # U+FFFD at the end: the last token holds only part of a character; wait for the rest.
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        cut = self._stop_at()
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            end = cut
        else:
            end = len(self.text) - (0 if final else self._held())
        piece = self.text[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return piece

    def _stop_at(self) -> int | None:
        if not self._stops:
            return None
        found = []
        for stop in self._stops:
            at = self.text.find(stop, max(0, self._sent - len(stop) + 1))
            if at >= 0:
                found.append(at)
        return min(found) if found else None

    def _held(self) -> int:
        """Length of the longest tail of `text` that is the start of a stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if stop.startswith(self.text[-size:]):
                    longest = size
                    break
        return longest


def text_offsets(decoder: Decoder, ids: Sequence[int]) -> tuple[str, list[int]]:
    """The text of `ids`, and where each token's text starts in it (the tokens of a character split over
    several all start where it does; one with no text, like `<s>`, where the next text starts)."""
    stream = TextStream(decoder)
    starts = []
    for token_id in ids:
        starts.append(len(stream.text))
        stream.push(token_id)
    stream.finish()
    return stream.text, starts


@dataclass(frozen=True)
class TokenText:
    """One token on its own, for log probabilities: its text, and its bytes (not its text's when it holds only
    part of a character: its text is then U+FFFD). An id the tokenizer lacks (a model's embedding table may be
    padded past its vocabulary) has no bytes and is named by its id, as vLLM names tokens by id."""

    text: str
    raw: bytes | None

    @property
    def whole(self) -> bool:
        """Its bytes are text on their own."""
        if self.raw is None:
            return True
        try:
            self.raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    def escaped(self) -> str:
        r"""Its bytes as \xNN escapes, the way OpenAI spells a token that is part of a character."""
        return "".join(f"\\x{byte:02x}" for byte in self.raw)


def token_text(token_id: int, text: str, piece: str | None) -> TokenText:
    """A token from its text decoded alone and its vocabulary piece (None: the tokenizer lacks the id): the
    piece's bytes (byte-level BPE or SentencePiece byte fallback) when the text is only part of a character,
    and the leading spaces a SentencePiece piece ("▁the") has but decoding it alone strips (else "▁the" and
    "the" would look alike)."""
    if piece is None:
        return TokenText(f"token_id:{token_id}", None)
    if not piece:
        return TokenText(text, text.encode())
    markers = len(piece) - len(piece.lstrip(METASPACE))
    missing = markers - (len(text) - len(text.lstrip(" ")))
    if markers and missing > 0 and not text.startswith(METASPACE):
        text = " " * missing + text
    if "\ufffd" in text:
        raw = _piece_bytes(piece)
        if raw is not None and raw.decode("utf-8", errors="replace") == text:
            return TokenText(text, raw)
    return TokenText(text, text.encode())


def _piece_bytes(piece: str) -> bytes | None:
    if match := BYTE_FALLBACK.fullmatch(piece):
        return bytes([int(match[1], 16)])
    if all(char in _BYTE_LEVEL for char in piece):
        return bytes(_BYTE_LEVEL[char] for char in piece)
    return None


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character to byte: printable bytes stand for themselves, the others for
    the characters from U+0100 on, in order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)}
    alphabet, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()
