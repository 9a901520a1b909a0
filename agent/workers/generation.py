"""Token generation on a causal LM with a KV cache: greedy or seeded sampling. Worker side: imports torch."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from agent.workers.generation_spec import GenerationRequest, GenerationResult, PromptError


@torch.inference_mode()
def generate(
    model: torch.nn.Module, request: GenerationRequest, eos_ids: Iterable[int] | None = None
) -> GenerationResult:
    """Continue `request.input_ids` one token per forward, reusing the KV cache; stops on eos, a stop
    sequence or `max_new_tokens`. The caller activates `request.adapter` on `model` first; PromptError
    (a client error) for an id outside the vocabulary."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab and not all(0 <= i < vocab for i in request.input_ids):
        # An id past the embedding table is a device-side assert on a GPU that poisons the CUDA context.
        bad = next(i for i in request.input_ids if not 0 <= i < vocab)
        raise PromptError(f"the prompt holds token id {bad}, outside this model's range [0, {vocab})")
    device = next(model.parameters()).device
    eos = set(model_eos_ids(model) if eos_ids is None else eos_ids)
    generator = None
    if request.temperature > 0:
        generator = torch.Generator(device=device)
        if request.seed is None:
            generator.seed()
        else:
            generator.manual_seed(request.seed)
    step_input = torch.tensor([request.input_ids], dtype=torch.long, device=device)
    past = None
    new: list[int] = []
    for _ in range(request.max_new_tokens):
        out = model(input_ids=step_input, past_key_values=past, use_cache=True)
        past = out.past_key_values
        token = _pick(out.logits[0, -1].float(), request.temperature, request.top_p, generator)
        if token in eos:
            return GenerationResult(tuple(new), "stop")
        new.append(token)
        for stop in request.stop_sequences:
            if len(new) >= len(stop) and tuple(new[-len(stop) :]) == stop:
                return GenerationResult(tuple(new[: -len(stop)]), "stop")
        step_input = torch.tensor([[token]], dtype=torch.long, device=device)
    return GenerationResult(tuple(new), "length")


def model_eos_ids(model: torch.nn.Module) -> set[int]:
    """The end-of-sequence ids the model declares (generation config first, then its config)."""
    for config in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(config, "eos_token_id", None)
        if value is not None:
            return {int(v) for v in (value if isinstance(value, list | tuple) else [value])}
    return set()


def _pick(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1:
        # Nucleus: the smallest set of most likely tokens whose mass reaches top_p (the top one always).
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= top_p] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
