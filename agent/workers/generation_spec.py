"""What a text-generation request asks of a causal-LM replica, and what the worker streams back (torch-free,
picklable: these cross the pipe between the agent and its worker)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]
MAX_TOP_LOGPROBS = 5  # alternatives per token, as OpenAI allows for completions
DEFAULT_GENERATION_TIMEOUT = 300.0  # seconds a generation may run unless the request or the agent says otherwise


class PromptError(ValueError):
    """A prompt the model cannot take (a token id outside its vocabulary): the client's error."""


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to continue; the worker's continuous batcher (agent.workers.continuous) runs it."""

    input_ids: tuple[int, ...]
    max_new_tokens: int = 16  # 0: the prompt's forward alone (for its log probabilities), no new token
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # ids that end the sequence (left out), besides the model's eos
    adapter: str | None = None  # the LoRA adapter to run with; None for the base model
    logprobs: int | None = None  # None: no log probabilities; k: the chosen token's and the top k alternatives'
    deadline: float | None = None  # time.monotonic() (one clock for every process of the host) to give up at
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's log probability and the top k there
    ignore_eos: bool = False  # the model's end of sequence is a token like any other (exact output lengths)
    min_tokens: int = 0  # no end of sequence or stop token is sampled before this many tokens

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError("a generation needs at least one prompt token")
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be 0 (the prompt alone) or more")
        if self.temperature < 0:
            raise ValueError("temperature must be 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be 0 (off) or more")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}")
        if not 0 <= self.min_tokens <= max(self.max_new_tokens, 0):
            raise ValueError("min_tokens must be from 0 to max_new_tokens")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"prompt_logprobs must be from 0 to {MAX_TOP_LOGPROBS}")


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's log probability and the most likely alternatives at that step, (id, logprob)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


# Each prompt token's log probability under the positions before it, with the top alternatives there; the first
# entry is None (nothing comes before the first token).
PromptLogprobs = tuple[TokenLogprob | None, ...]


@dataclass(frozen=True)
class Token:
    """One generated token of one sequence, as the worker streams it. A sequence's first token carries its prompt
    log probabilities when they were asked for (sent once, so its result does not repeat them)."""

    request_id: int
    token_id: int
    logprob: TokenLogprob | None = None
    prompt_logprobs: PromptLogprobs | None = None


@dataclass(frozen=True)
class GenerationResult:
    """How a sequence ended: the tokens it produced (the end-of-sequence or stop token left out) and why; its
    prompt log probabilities when asked for and no token carried them (it ended before streaming one)."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: PromptLogprobs | None = None


@dataclass(frozen=True)
class EngineStats:
    """The batcher's state after a step, for metrics: sequences decoding, sequences waiting, KV cache bytes, and
    the LoRA adapters each group asked for (an endpoint picker's adapter affinity reads them: agent.msp)."""

    running: int = 0
    waiting: int = 0
    kv_cache_bytes: int = 0
    # Last, with defaults: an adopted worker of an older version pickles none (by name), and reads as no adapters.
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    # Counters since the worker started, and the prefix cache's bytes (agent.workers.prefix_cache); last too.
    prefill_tokens: int = 0  # prompt tokens run through the model (a prefix-cache hit's are not)
    prefix_hits: int = 0  # prompts that reused a cached prefix
    prefix_misses: int = 0  # prompts long enough to reuse one that found none
    prefix_hit_tokens: int = 0  # prompt tokens reused from the cache
    prefix_cache_bytes: int = 0  # held by cached prefixes (apart from kv_cache_bytes, the running sequences')
