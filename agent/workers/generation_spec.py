"""What a text-generation request asks of a causal-LM replica, and what it answers (torch-free, picklable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]


class PromptError(ValueError):
    """A prompt the model cannot take (a token id outside its vocabulary): the client's error."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue; the daemon sends it, the worker runs agent.workers.generation.generate."""

    input_ids: tuple[int, ...]
    max_new_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # token id sequences that end the generation
    adapter: str | None = None  # the LoRA adapter to run with; None for the base model

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError("a generation needs at least one prompt token")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if any(not sequence for sequence in self.stop_sequences):
            raise ValueError("a stop sequence needs at least one token")


@dataclass(frozen=True)
class GenerationResult:
    """The new tokens (the stop sequence or end-of-sequence token left out) and why generation ended."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason
