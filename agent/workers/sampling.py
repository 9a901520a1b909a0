"""Choose each sequence's next token from a step's logits, with its own sampling settings (worker side: torch).

Every setting the API allows must sample: the scores are shifted so the best is 0 before the temperature
divides them (a tiny temperature then gives -inf to the rest, never +inf to the best), and the nucleus always
keeps the top token. A row whose logits are not finite fails alone; the rest of the batch goes on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agent.workers.generation_spec import GenerationRequest, TokenLogprob

PROMPT_ROWS_AT_ONCE = 256  # prompt positions turned into a float32 [rows, vocab] table at a time
NOT_FINITE = "the model's output for this sequence is not finite (NaN or infinity): its weights or config are broken"


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
) -> tuple[list[int], list[TokenLogprob | None], dict[int, str]]:
    """Row i's next token under requests[i]'s settings, its log probabilities when asked for, and the rows that
    failed (row -> reason; their token is -1). `logits` is [rows, vocab] for the last position of each row."""
    logits = logits.float()
    # NaN or +inf anywhere, or nothing but -inf: no distribution to sample. Some -inf (masked tokens) is fine.
    broken = (torch.isnan(logits) | torch.isposinf(logits)).any(dim=-1) | torch.isneginf(logits).all(dim=-1)
    failures = {i: NOT_FINITE for i in torch.nonzero(broken).flatten().tolist()}
    greedy = torch.argmax(logits, dim=-1).tolist()  # one call for every greedy row
    tokens = [
        -1 if i in failures else greedy[i] if request.temperature == 0 else _sample(logits[i], request, generators[i])
        for i, request in enumerate(requests)
    ]
    logprobs: list[TokenLogprob | None] = [None] * len(requests)
    wanted = [i for i, request in enumerate(requests) if request.logprobs is not None and i not in failures]
    if wanted:
        # Log probabilities of the model's own distribution (before temperature and cuts), as OpenAI reports.
        table = torch.log_softmax(logits[wanted], dim=-1)
        for row, i in enumerate(wanted):
            count = requests[i].logprobs or 0
            top = torch.topk(table[row], count) if count else None
            alternatives = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
            logprobs[i] = TokenLogprob(float(table[row, tokens[i]]), alternatives)
    return tokens, logprobs, failures


def prompt_logprobs(logits: torch.Tensor, targets: torch.Tensor, count: int,
                    rows_at_once: int = PROMPT_ROWS_AT_ONCE) -> list[TokenLogprob]:
    """Log probability of targets[i] under logits[i] ([positions, vocab], any dtype) and the top `count` there, best
    first: the model's own distribution in float32, computed a slice of positions at a time (a long prompt's whole
    float32 table would be as large as its logits again)."""
    count = min(count, logits.shape[-1])
    entries = []
    for start in range(0, len(targets), rows_at_once):
        table = torch.log_softmax(logits[start : start + rows_at_once].float(), dim=-1)
        wanted = targets[start : start + rows_at_once].to(table.device)
        chosen = table.gather(1, wanted.unsqueeze(1)).squeeze(1).tolist()
        if count:
            top = torch.topk(table, count)
            alternatives = [tuple(zip(i, v, strict=True)) for i, v in zip(top.indices.tolist(), top.values.tolist(),
                                                                           strict=True)]
        else:
            alternatives = [()] * len(chosen)
        entries += [TokenLogprob(lp, alt) for lp, alt in zip(chosen, alternatives, strict=True)]
    return entries


def _sample(logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator | None) -> int:
    scores = (logits - logits.max()) / request.temperature
    if request.top_k and request.top_k < scores.shape[-1]:
        kth = torch.topk(scores, request.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if request.top_p < 1:
        # Nucleus: the smallest set of most likely tokens whose mass reaches top_p, the top one always (a tiny
        # top_p is 0 in float32, which would cut them all).
        sorted_probs, order = torch.sort(probs, descending=True)
        cut = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= request.top_p
        cut[0] = False
        sorted_probs[cut] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
