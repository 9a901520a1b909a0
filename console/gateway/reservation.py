"""The most tokens a request may use, known before it runs and without a tokenizer: what admission reserves against
the token limits (limits.py), settled to the engine's own count when the request ends.

Completion: `max_tokens` (chat: `max_completion_tokens` first; /v1/responses: `max_output_tokens`) for each choice
(`n`, `best_of`) of each prompt, else what both engines use when it is absent: 16 on /v1/completions, the rest of the
context on chat and responses, and on completions too when it is null (agent/serving/openai.py; vLLM's
get_max_tokens). Counts are read as laxly as vLLM's parser reads them ("4000" is 4000).

Prompt: the request body's length in bytes. A byte-level BPE tokenizer (GPT-2's, Llama 3's, Qwen's) makes at most
one token of each byte of UTF-8 text, and SentencePiece and WordPiece at most one per character plus a few special
ones; JSON spends at least a byte on every byte of text and several on each message's and prompt's framing, which
stands in for the chat template's special tokens. So the body's bytes bound its prompts' tokens, at about four times
what English text really takes: a prompt is over-reserved while its request is in flight (and charged so only where
its client left before the engine's count: usage.Meter.charged). Nothing is tokenized or walked: the console's event
loop does I/O only. Every sequence (prompt and completion) fits the engine's context, which bounds both."""

from __future__ import annotations

import math
from typing import NamedTuple

COMPLETION_DEFAULT = 16  # /v1/completions without max_tokens: OpenAI's default, the built-in engine's and vLLM's
UNKNOWN_CONTEXT = 2048  # vLLM's context for a model whose config declares none (the built-in engine's is 256 then)
# Where the engines count tokens (a `usage` comes back), and the field that caps each choice's completion.
GENERATING = {"/v1/completions": ("max_tokens",), "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
              "/v1/responses": ("max_output_tokens",)}
PROMPTS = {"/v1/completions": "prompt", "/v1/embeddings": "input"}  # where one body may hold several prompts


class Need(NamedTuple):
    """What one request may use: `tokens` in all, of which up to `prompt` for its prompts (its body's bytes) and
    `completion` for each of its `choices` (prompts x n)."""

    tokens: int
    prompt: int
    completion: int
    choices: int

    def __str__(self) -> str:
        if not self.completion:
            return f"up to {self.tokens} tokens for its input (its body's {self.prompt} bytes)"
        each = f"each of its {self.choices} choices" if self.choices > 1 else "its completion"
        return f"up to {self.tokens} tokens ({self.prompt} for its prompt, counted as its body's bytes, and " \
               f"{self.completion} for {each})"

    def completion_within(self, limit: int) -> int:
        """The largest max_tokens that would fit this request under `limit` (0: none would)."""
        return max(0, (limit - self.prompt) // self.choices) if self.choices else 0


NOTHING = Need(0, 0, 0, 0)  # v2 and vLLM's /tokenize and /detokenize: the engines count no tokens for them


def need(path: str, body: dict | None, size: int, context: int | None) -> Need:
    """The most tokens a request to `path` with this parsed OpenAI `body` of `size` bytes may use on a deployment whose
    engine holds `context` tokens per sequence (None: unknown)."""
    if body is None or (path not in GENERATING and path not in PROMPTS):
        return NOTHING
    prompts = _count(body.get(PROMPTS.get(path, "")))
    if path not in GENERATING:  # embeddings: their input alone, each at most a context long
        prompt = min(size, prompts * context) if context else size
        return Need(prompt, prompt, 0, 0)
    field = next((f for f in GENERATING[path] if body.get(f) is not None), None)
    asked = _whole(body.get(field)) if field else None
    if asked is None:
        # Absent: 16 on /v1/completions, the field's default in both engines. Null there, as on chat and responses:
        # vLLM generates to the end of the context. Not a count: the engine refuses it, so holding the most is free.
        named = any(f in body for f in GENERATING[path])
        asked = COMPLETION_DEFAULT if path == "/v1/completions" and not named else (context or UNKNOWN_CONTEXT)
    choices = prompts * max(_whole(body.get("n")) or 1, _whole(body.get("best_of")) or 1)
    completion = min(asked, context) if context else asked
    prompt = min(size, prompts * context) if context else size
    total = prompt + choices * completion
    if context:  # each prompt with each of its choices fits the context: a prompt's tokens leave a choice fewer
        total = min(total, choices * context)
    return Need(total, prompt, completion, choices)


def _count(prompt) -> int:
    """How many prompts one body's `prompt` (or `input`) holds: a list of strings or of token lists is several."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def _whole(value) -> int | None:
    """`value` as a count, read at least as laxly as the engines' parsers read one (pydantic takes "4000", " 4000 ",
    "4_000" and 4000.0 for 4000), rounded up; None when it is none."""
    if isinstance(value, str) and len(value) <= 40:
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and 0 <= value < math.inf:
        return math.ceil(value)
    return None
