"""Prompt log probabilities in the continuous batcher (for /v1/completions with echo): each prompt token's log
probability under the positions before it and the top alternatives there, equal to a plain transformers forward of
the same tiny Llama, whether prompts are prefilled together (left-padded) or a long one in chunks; and a sequence
asking for no new tokens ends right after its prefill (imports torch)."""

import pytest

from agent.workers.generation_spec import GenerationRequest, PromptError
from tests.agent.workers.tiny_batcher import PROMPTS, batcher

torch = pytest.importorskip("torch")


def drive(engine, requests):
    """Submit requests[i] as id i and step to the end: (tokens streamed per id, results per id)."""
    for rid, request in enumerate(requests):
        engine.submit(rid, request)
    tokens, results = {}, {}
    while engine.busy:
        out = engine.step()
        assert not out.failed, out.failed
        for token in out.tokens:
            tokens.setdefault(token.request_id, []).append(token)
        results.update(dict(out.finished))
    return tokens, results


def prompt_logprobs_of(tokens, results, rid):
    """The prompt log probabilities a sequence was sent: on its first token, else on its result."""
    first = tokens.get(rid, [None])[0]
    if first is not None and first.prompt_logprobs is not None:
        return first.prompt_logprobs
    return results[rid].prompt_logprobs


def expected(model, prompt):
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # row p: the distribution of the token after position p


def assert_matches(model, prompt, got, top):
    table = expected(model, prompt)
    assert len(got) == len(prompt)
    assert got[0] is None  # nothing comes before the first token
    for position in range(1, len(prompt)):
        entry, row = got[position], table[position - 1]
        assert entry.logprob == pytest.approx(float(row[prompt[position]]), abs=1e-4), position
        best = torch.topk(row, top)
        assert [t for t, _ in entry.top] == best.indices.tolist(), position
        assert [lp for _, lp in entry.top] == pytest.approx(best.values.tolist(), abs=1e-4)


def test_prompts_prefilled_together_get_the_log_probabilities_of_a_plain_forward(model):
    requests = [GenerationRequest(p, 3, temperature=0, logprobs=2, prompt_logprobs=5) for p in PROMPTS]
    tokens, results = drive(batcher(model), requests)
    for rid, prompt in enumerate(PROMPTS):
        assert_matches(model, prompt, prompt_logprobs_of(tokens, results, rid), 5)


def test_a_long_prompt_prefilled_in_chunks_gets_the_same_log_probabilities(model):
    prompt = tuple(range(1, 61))
    tokens, results = drive(batcher(model, token_budget=16), [GenerationRequest(prompt, 2, temperature=0,
                                                                               prompt_logprobs=3)])
    assert_matches(model, prompt, prompt_logprobs_of(tokens, results, 0), 3)


def test_the_first_token_carries_them_once_and_the_result_does_not_repeat_them(model):
    tokens, results = drive(batcher(model), [GenerationRequest(PROMPTS[0], 4, temperature=0, prompt_logprobs=1)])
    assert tokens[0][0].prompt_logprobs is not None
    assert all(t.prompt_logprobs is None for t in tokens[0][1:])
    assert results[0].prompt_logprobs is None


def test_only_the_sequences_that_ask_get_prompt_log_probabilities_and_all_keep_their_solo_tokens(model):
    asking = [GenerationRequest(p, 6, temperature=0, prompt_logprobs=0 if i % 2 else None)
              for i, p in enumerate(PROMPTS)]
    tokens, results = drive(batcher(model), asking)
    alone = [drive(batcher(model), [GenerationRequest(p, 6, temperature=0)])[1][0] for p in PROMPTS]
    for rid, request in enumerate(asking):
        got = prompt_logprobs_of(tokens, results, rid)
        assert (got is None) == (request.prompt_logprobs is None)
        if got is not None:
            assert all(entry.top == () for entry in got[1:])  # 0 alternatives asked for
        assert results[rid].token_ids == alone[rid].token_ids


def test_no_new_tokens_ends_the_sequence_after_its_prefill_with_only_the_prompts_log_probabilities(model):
    requests = [GenerationRequest(PROMPTS[0], 0, prompt_logprobs=5), GenerationRequest(PROMPTS[2], 5, temperature=0)]
    engine = batcher(model)
    tokens, results = drive(engine, requests)
    assert 0 not in tokens
    assert results[0].token_ids == () and results[0].finish_reason == "length"
    assert_matches(model, PROMPTS[0], results[0].prompt_logprobs, 5)
    assert len(results[1].token_ids) == 5  # its neighbour in the prefill was not disturbed
    assert engine.stats().kv_cache_bytes == 0


def test_a_sequence_whose_first_token_ends_it_still_gets_its_prompt_log_probabilities(model):
    first = drive(batcher(model), [GenerationRequest(PROMPTS[1], 1, temperature=0)])[1][0].token_ids[0]
    tokens, results = drive(batcher(model, eos_ids={first}),
                            [GenerationRequest(PROMPTS[1], 4, temperature=0, prompt_logprobs=2)])
    assert 0 not in tokens and results[0].finish_reason == "stop"
    assert_matches(model, PROMPTS[1], results[0].prompt_logprobs, 2)


def test_a_prompt_that_fills_every_position_may_ask_for_no_new_tokens_only(model):
    full = tuple(range(1, 257))
    _tokens, results = drive(batcher(model), [GenerationRequest(full, 0, prompt_logprobs=0)])
    assert len(results[0].prompt_logprobs) == 256
    with pytest.raises(PromptError, match="at most 256 positions"):
        batcher(model).submit(0, GenerationRequest(full, 1))


def test_a_request_for_no_new_tokens_or_too_many_alternatives_is_checked():
    assert GenerationRequest((1,), 0).max_new_tokens == 0
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationRequest((1,), -1)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        GenerationRequest((1,), 1, prompt_logprobs=6)


def test_prompt_log_probabilities_are_computed_in_float32_from_half_precision_logits():
    from agent.workers.sampling import prompt_logprobs

    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(7, 50, generator=generator) * 8).to(torch.bfloat16)
    targets = torch.randint(0, 50, (7,), generator=generator)
    got = prompt_logprobs(logits, targets, 5, rows_at_once=3)
    table = torch.log_softmax(logits.float(), dim=-1)
    assert [g.logprob for g in got] == pytest.approx(table.gather(1, targets[:, None]).squeeze(1).tolist(), abs=1e-6)
    for row, entry in enumerate(got):  # the best 5, best first (bfloat16 may tie: compared by value)
        assert [lp for _, lp in entry.top] == pytest.approx(torch.topk(table[row], 5).values.tolist(), abs=1e-6)
        assert [float(table[row, t]) for t, _ in entry.top] == pytest.approx([lp for _, lp in entry.top], abs=1e-6)
