"""Usage accounting on the gateway: what each request cost, from the engines' own `usage`, tallied in memory per
minute, team, token and deployment, and drained by the gateway's flusher into the database (console/usage).

Reading `usage` never parses a whole answer: the last `"usage"` key of a JSON body (OpenAI puts it after the
choices or embeddings) is found at C speed and only its small object is decoded. A stream is asked for its usage
chunk (`stream_options.include_usage`); when the client did not ask for it, that chunk is taken out of what it
gets, so it sees exactly what it asked for."""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field

from console.gateway.reservation import Need

log = logging.getLogger("modelgrid.gateway")
_DECODER = json.JSONDecoder()
_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
STREAMED_PATHS = ("/v1/completions", "/v1/chat/completions")  # where OpenAI's stream_options.include_usage applies
MAX_PENDING = 64 * 1024  # a stream without an event boundary this long is passed on as it comes (not SSE as expected)
MAX_KEYS = 100_000  # tally entries kept for a database that is away; past it, new counts are dropped (and logged)

# One tally entry: requests, errors, prompt tokens, completion tokens, queue seconds.
Key = tuple[int, int, int, str]  # (minute as unix seconds, team id, token id, deployment)


def find_usage(data: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens of the last `"usage"` object in a JSON text (OpenAI's prompt/completion tokens,
    or vLLM's /v1/responses input/output tokens), or None when there is none. Only that object is decoded. A
    `"usage"` that is a string value (a decoded token, after the object) is passed over: only a key has a colon."""
    end = len(data)
    while True:
        at = data.rfind(b'"usage"', 0, end)
        if at < 0:
            return None
        match = _USAGE_KEY.match(data, at)
        if match is not None:
            break
        end = at
    try:
        value, _ = _DECODER.raw_decode(data[match.end():match.end() + 4096].decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    prompt = value.get("prompt_tokens", value.get("input_tokens"))
    completion = value.get("completion_tokens", value.get("output_tokens", 0))
    if not _count(prompt) or not _count(completion or 0):
        return None
    return prompt, completion or 0


def _count(value) -> bool:
    return type(value) is int and value >= 0


def ask_for_usage(parsed: dict) -> bool:
    """Make a streamed OpenAI request ask for its usage chunk; True when the client had not asked for it (its
    chunk is then to be taken out of the answer)."""
    options = parsed.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    parsed["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return True


@dataclass
class Meter:
    """What one request's answer said it cost, filled in as it passes through the gateway."""

    strip: bool = False  # take the usage-only chunk out of the stream (the client did not ask for it)
    prompt: int = 0
    completion: int = 0
    found: bool = False  # an engine's usage was read
    sent: bool = False  # the request went to an agent: its engine may have run it
    streamed: bool = False  # its answer is a stream of events, charged by the events it streamed
    failed: bool = False  # its stream ended with an error event (its agent's, or its engine's)
    _pending: bytes = field(default=b"", repr=False)
    _sep: bytes = field(default=b"", repr=False)  # the stream's event boundary: LF LF, or CRLF CRLF (SSE allows both)

    def read(self, content: bytes) -> None:
        if (found := find_usage(content)) is not None:
            self.prompt, self.completion = found
            self.found = True

    def cut(self, events: int) -> None:
        """A stream that ended, perhaps without its usage chunk (the client went away, it broke off): its completion
        tokens estimated as the events it streamed (one token each, as the engines stream)."""
        if not self.found:
            self.completion = max(self.completion, events)

    def charged(self, need: Need, left: bool) -> tuple[int, int]:
        """The (prompt, completion) tokens a finished request is charged: the engine's count where it was read. A
        request whose client `left` after it was sent, before that count came back, is charged its reservation's
        prompt, and the events it streamed or (not streamed) its whole reserved completion: its engine ran it, and
        a client that walks away before the answer does not thereby spend nothing. Otherwise what was read."""
        if self.found or not (left and self.sent):
            return self.prompt, self.completion
        return need.prompt, self.completion if self.streamed else need.tokens - need.prompt

    def events(self, chunk: bytes, last: bool = False) -> bytes:
        """Pass server-sent events through: whole events only (a partial one waits for the rest), each event's
        usage read (the last one seen counts: a stream's usage is cumulative), a usage-only chunk taken out
        when `strip`."""
        data = self._pending + chunk
        if not self._sep and b"\n" in data:
            self._sep = b"\r\n\r\n" if b"\r\n" in data else b"\n\n"
        sep = self._sep or b"\n\n"
        if last:
            whole, self._pending = data, b""
        else:
            end = data.rfind(sep)
            if end < 0 and len(data) <= MAX_PENDING:
                self._pending = data
                return b""
            if end < 0:
                end = len(data) - len(sep)
            whole, self._pending = data[:end + len(sep)], data[end + len(sep):]
        if not self.failed and b'"error"' in whole:
            self.failed = any(_is_error(event) for event in whole.split(sep))
        if b'"usage"' not in whole:
            return whole
        kept = []
        for event in whole.split(sep):
            if b'"usage"' in event:
                self.read(event)
                if self.strip and _NO_CHOICES.search(event) and find_usage(event) is not None:
                    continue
            kept.append(event)
        return sep.join(kept)


def _is_error(event: bytes) -> bool:
    """Whether a server-sent event is an error object (OpenAI's `{"error": ...}`, or vLLM's `"object": "error"`), as
    a stream that failed after it began ends."""
    data = event.strip()
    if not data.startswith(b"data:") or len(data) > MAX_PENDING:
        return False
    try:
        value = json.loads(data[5:])
    except ValueError:
        return False
    return isinstance(value, dict) and ("error" in value or value.get("object") == "error")


class Tally:
    """Requests, errors, tokens and queue time per (minute, team, token, deployment) since the last drain."""

    def __init__(self) -> None:
        self.rows: dict[Key, list] = {}

    def add(self, deployment: str, team: int, token: int, status: int, queue_s: float, prompt: int,
            completion: int, now: float | None = None) -> None:
        minute = int((time.time() if now is None else now) // 60) * 60
        row = self.rows.get(key := (minute, team, token, deployment))
        if row is None:
            self.rows[key] = [1, int(status >= 400), prompt, completion, queue_s]
            return
        row[0] += 1
        row[1] += status >= 400
        row[2] += prompt
        row[3] += completion
        row[4] += queue_s

    def drain(self) -> dict[Key, list]:
        rows, self.rows = self.rows, {}
        return rows

    def restore(self, rows: dict[Key, list]) -> None:
        """Put back what a failed write did not store, so the next flush carries it (bounded: MAX_KEYS)."""
        if len(self.rows) + len(rows) > MAX_KEYS:
            log.error("usage: the database has been away too long; %d tallies of requests are dropped", len(rows))
            return
        for key, (requests, errors, prompt, completion, queue_s) in rows.items():
            row = self.rows.setdefault(key, [0, 0, 0, 0, 0.0])
            row[0] += requests
            row[1] += errors
            row[2] += prompt
            row[3] += completion
            row[4] += queue_s
