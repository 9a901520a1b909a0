"""Choose each sequence's next token from a step's logits, with its own sampling settings (worker side: torch)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agent.workers.generation_spec import GenerationRequest, TokenLogprob


def model_eos_ids(model: torch.nn.Module) -> set[int]:
    """The end-of-sequence ids the model declares (generation config first, then its config)."""
    for config in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(config, "eos_token_id", None)
        if value is not None:
            return {int(v) for v in (value if isinstance(value, list | tuple) else [value])}
    return set()


def new_generator(request: GenerationRequest, device: torch.device) -> torch.Generator | None:
    """A sequence's own random stream: seeded ones repeat whatever else shares the batch; greedy needs none."""
    if request.temperature == 0:
        return None
    generator = torch.Generator(device=device)
    if request.seed is None:
        generator.seed()
    else:
        generator.manual_seed(request.seed)
    return generator


def choose(
    logits: torch.Tensor, requests: Sequence[GenerationRequest], generators: Sequence[torch.Generator | None]
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Row i's next token under requests[i]'s settings, and its log probabilities when asked for.
    `logits` is [rows, vocab] for the last position of each row."""
    logits = logits.float()
    greedy = torch.argmax(logits, dim=-1).tolist()  # one call for every greedy row
    tokens = [
        greedy[i] if request.temperature == 0 else _sample(logits[i], request, generators[i])
        for i, request in enumerate(requests)
    ]
    logprobs: list[TokenLogprob | None] = [None] * len(requests)
    wanted = [i for i, request in enumerate(requests) if request.logprobs is not None]
    if wanted:
        # Log probabilities of the model's own distribution (before temperature and cuts), as OpenAI reports.
        table = torch.log_softmax(logits[wanted], dim=-1)
        for row, i in enumerate(wanted):
            count = requests[i].logprobs or 0
            top = torch.topk(table[row], count) if count else None
            alternatives = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
            logprobs[i] = TokenLogprob(float(table[row, tokens[i]]), alternatives)
    return tokens, logprobs


def _sample(logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator | None) -> int:
    scores = logits / request.temperature
    if request.top_k and request.top_k < scores.shape[-1]:
        kth = torch.topk(scores, request.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if request.top_p < 1:
        # Nucleus: the smallest set of most likely tokens whose mass reaches top_p (the top one always).
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= request.top_p] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
