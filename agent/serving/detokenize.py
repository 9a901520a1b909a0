"""Token ids to text as they stream in, with OpenAI's stop strings (torch-free).

A token's text can still change when the next one arrives (a multi-byte character split over two tokens,
a word-piece that merges), and text that may be the start of a stop string must not be sent before the
stop is ruled out. So text is released only once it is settled: each new token is decoded together with a
few tokens before it (the offsets technique of Hugging Face's text-generation-inference), and the tail
that could begin a stop string is held back until the next token or the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


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
