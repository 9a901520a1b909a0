"""The continuous batcher on the tiny demo Llama (imports torch): sequences join and leave a running batch,
and each one's tokens are what it would get alone."""

import time

import pytest

from agent.workers.generation_spec import GenerationRequest, PromptError
from tests.agent.workers.tiny_batcher import PROMPTS, batcher

torch = pytest.importorskip("torch")


def run(engine, requests, *, join_after=None, cancel=None, steps=500):
    """Drive `engine` to the end; requests[i] is submitted as id i (those in join_after at that step)."""
    join_after = join_after or {}
    streamed, finished, failed = {}, {}, {}
    for rid, request in enumerate(requests):
        if rid not in join_after:
            engine.submit(rid, request)
    for step in range(steps):
        for rid, at in join_after.items():
            if at == step:
                engine.submit(rid, requests[rid])
        if cancel and cancel[1] == step:
            engine.cancel(cancel[0])
        if not engine.busy and all(at < step for at in join_after.values()):
            break
        out = engine.step()
        for token in out.tokens:
            streamed.setdefault(token.request_id, []).append(token.token_id)
        finished.update(dict(out.finished))
        failed.update({f.request_id: f for f in out.failed})
    return streamed, finished, failed


def reference(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_one_greedy_sequence_matches_transformers_generate(model):
    streamed, finished, _ = run(batcher(model), [GenerationRequest(PROMPTS[0], 12, temperature=0)])
    assert finished[0].token_ids == tuple(reference(model, PROMPTS[0], 12))
    assert streamed[0] == list(finished[0].token_ids)
    assert finished[0].finish_reason == "length"


def test_sequences_joining_and_leaving_a_running_batch_each_get_their_solo_tokens(model):
    lengths = [12, 3, 20, 7]
    requests = [GenerationRequest(p, n, temperature=0) for p, n in zip(PROMPTS, lengths, strict=True)]
    streamed, finished, failed = run(batcher(model), requests, join_after={2: 2, 3: 5})
    assert not failed
    for rid, (prompt, n) in enumerate(zip(PROMPTS, lengths, strict=True)):
        assert list(finished[rid].token_ids) == reference(model, prompt, n), rid
        assert streamed[rid] == list(finished[rid].token_ids)


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode(model):
    long_prompt = tuple(range(1, 101))
    engine = batcher(model, token_budget=16)
    requests = [GenerationRequest(PROMPTS[0], 30, temperature=0), GenerationRequest(long_prompt, 5, temperature=0)]
    tokens_per_step = []
    engine.submit(0, requests[0])
    engine.step()
    engine.submit(1, requests[1])
    results = {}
    while engine.busy:
        out = engine.step()
        tokens_per_step.append({t.request_id for t in out.tokens})
        results.update(dict(out.finished))
    # The first sequence got a token in every step while the long prompt was prefilled 16 tokens at a time.
    assert all(0 in seen for seen in tokens_per_step[:6])
    assert list(results[1].token_ids) == reference(model, long_prompt, 5)
    assert list(results[0].token_ids) == reference(model, PROMPTS[0], 30)


def test_seeded_sampling_repeats_itself_whatever_shares_the_batch(model):
    sampled = GenerationRequest(PROMPTS[0], 10, temperature=0.9, top_k=50, top_p=0.95, seed=7)
    alone = run(batcher(model), [sampled])[1][0]
    crowd = run(batcher(model), [GenerationRequest(PROMPTS[1], 10, temperature=1.0, seed=1), sampled,
                                 GenerationRequest(PROMPTS[2], 4, temperature=0)])[1][1]
    assert alone.token_ids == crowd.token_ids
    other = run(batcher(model), [GenerationRequest(PROMPTS[0], 10, temperature=0.9, top_k=50, seed=8)])[1][0]
    assert other.token_ids != alone.token_ids


def test_top_k_of_one_is_greedy(model):
    result = run(batcher(model), [GenerationRequest(PROMPTS[0], 8, temperature=1.5, top_k=1, seed=3)])[1][0]
    assert list(result.token_ids) == reference(model, PROMPTS[0], 8)


def test_extreme_but_valid_sampling_settings_sample_and_share_the_batch(model):
    # temperature 1e-40 overflowed the scaled logits to inf, and top_p 1e-300 (0 in float32) cut every token:
    # either raised in torch.multinomial and took the whole worker down.
    engine = batcher(model)
    requests = [GenerationRequest(PROMPTS[0], 6, temperature=1e-40, seed=1),
                GenerationRequest(PROMPTS[1], 6, temperature=1.0, top_p=1e-300, seed=2),
                GenerationRequest(PROMPTS[2], 6, temperature=0)]
    streamed, finished, failed = run(engine, requests)
    assert failed == {}
    assert list(finished[0].token_ids) == reference(model, PROMPTS[0], 6)  # as cold as it gets: greedy
    assert list(finished[1].token_ids) == reference(model, PROMPTS[1], 6)  # only the top token is left
    assert list(finished[2].token_ids) == reference(model, PROMPTS[2], 6)


def test_a_sequence_whose_logits_are_not_finite_fails_alone(model):
    # A broken model (an absurd rope_theta in bf16, bad weights) makes NaN logits: that sequence fails with a
    # reason; the others in its batch carry on with their solo tokens.
    from agent.workers.sampling import choose

    logits = torch.zeros(3, 8)
    logits[0, 3] = 5.0
    logits[1, 2] = float("nan")
    logits[2, :] = float("-inf")
    requests = [GenerationRequest((1,), 2, temperature=0.7, seed=1)] * 3
    tokens, _, failures = choose(logits, requests, [torch.Generator().manual_seed(1) for _ in requests])
    assert tokens[0] == 3 and set(failures) == {1, 2}
    assert "not finite" in failures[1]


def test_a_sampling_step_that_raises_fails_its_sequences_and_the_batcher_goes_on(model, monkeypatch):
    from agent.workers import continuous

    engine = batcher(model)
    engine.submit(0, GenerationRequest(PROMPTS[0], 4, temperature=0))

    def broken(*args):
        raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")

    monkeypatch.setattr(continuous, "choose", broken)
    _, finished, failed = run(engine, [])
    assert failed[0].kind == "error" and "CUBLAS" in failed[0].text and not finished and not engine.busy
    monkeypatch.undo()
    assert run(engine, [GenerationRequest(PROMPTS[1], 3, temperature=0)])[1][0].finish_reason == "length"


def test_logprobs_are_the_models_own_and_list_the_top_alternatives(model):
    result = run(batcher(model), [GenerationRequest(PROMPTS[0], 3, temperature=0, logprobs=5)])[1][0]
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPTS[0]])).logits[0, -1]
    table = torch.log_softmax(logits.float(), -1)
    first = result.logprobs[0]
    assert first.logprob == pytest.approx(float(table[result.token_ids[0]]), abs=1e-4)
    assert [token for token, _ in first.top] == torch.topk(table, 5).indices.tolist()
    assert first.top[0][0] == result.token_ids[0]  # greedy: the chosen token is the most likely one


def test_a_stop_token_ends_the_sequence_and_is_left_out(model):
    expected = reference(model, PROMPTS[0], 12)
    stop = expected[4]
    result = run(batcher(model), [GenerationRequest(PROMPTS[0], 12, temperature=0, stop_token_ids=(stop,))])[1][0]
    assert list(result.token_ids) == expected[: expected.index(stop)]
    assert result.finish_reason == "stop"


def test_ignore_eos_generates_through_the_models_end_of_sequence(model):
    # Benchmarks ask for exact output lengths (GuideLLM sends ignore_eos): the model's eos is then a token like any.
    expected = reference(model, PROMPTS[0], 12)
    eos = expected[4]
    request = GenerationRequest(PROMPTS[0], 12, temperature=0, ignore_eos=True)
    result = run(batcher(model, eos_ids={eos}), [request])[1][0]
    assert list(result.token_ids) == expected and result.finish_reason == "length"
    result = run(batcher(model, eos_ids={eos}), [GenerationRequest(PROMPTS[0], 12, temperature=0)])[1][0]
    assert list(result.token_ids) == expected[:4] and result.finish_reason == "stop"


def test_min_tokens_holds_off_the_end_of_sequence_and_stop_tokens(model):
    expected = reference(model, PROMPTS[0], 12)
    stop = expected[4]
    request = GenerationRequest(PROMPTS[0], 12, temperature=0, stop_token_ids=(stop,), min_tokens=6)
    result = run(batcher(model), [request])[1][0]
    tokens = list(result.token_ids)
    assert tokens[:4] == expected[:4] and tokens[4] != stop  # never sampled before the sixth token
    assert len(tokens) >= 6 and stop not in tokens[:6]


def test_a_cancelled_sequence_leaves_and_the_others_carry_on(model):
    requests = [GenerationRequest(p, 15, temperature=0) for p in PROMPTS[:3]]
    engine = batcher(model)
    streamed, finished, failed = run(engine, requests, cancel=(1, 4))
    assert 1 not in finished and 1 not in failed
    assert len(streamed[1]) < 15
    assert list(finished[0].token_ids) == reference(model, PROMPTS[0], 15)
    assert list(finished[2].token_ids) == reference(model, PROMPTS[2], 15)
    assert engine.stats().running == 0 and engine.stats().kv_cache_bytes == 0


def test_a_passed_deadline_fails_the_sequence_as_a_timeout(model):
    engine = batcher(model)
    engine.submit(0, GenerationRequest(PROMPTS[0], 200, temperature=0, deadline=time.monotonic() + 0.05))
    engine.submit(1, GenerationRequest(PROMPTS[1], 3, temperature=0))
    failures, finished = [], {}
    while engine.busy:
        out = engine.step()
        failures += out.failed
        finished.update(dict(out.finished))
        time.sleep(0.005)
    assert [(f.request_id, f.kind) for f in failures] == [(0, "timeout")]
    assert 1 in finished


def test_generation_stops_at_the_models_last_position(model):
    prompt = tuple(range(1, 251))
    result = run(batcher(model), [GenerationRequest(prompt, 50, temperature=0)])[1][0]
    assert len(result.token_ids) == 6 and result.finish_reason == "length"


def test_a_prompt_it_cannot_take_is_refused_at_submit(model):
    engine = batcher(model)
    with pytest.raises(PromptError, match="outside this model's range"):
        engine.submit(0, GenerationRequest((1, 5000), 4))
    with pytest.raises(PromptError, match="at most 256 positions"):
        engine.submit(1, GenerationRequest(tuple(range(1, 300)), 4))
    assert not engine.busy


def test_the_kv_cache_is_counted_while_sequences_run_and_freed_after(model):
    engine = batcher(model)
    engine.submit(0, GenerationRequest(PROMPTS[0], 5, temperature=0))
    engine.step()
    stats = engine.stats()
    assert stats.running == 1 and stats.kv_cache_bytes > 0
    while engine.busy:
        engine.step()
    assert engine.stats().kv_cache_bytes == 0


def test_its_stats_name_the_adapters_running_and_waiting(model):
    engine = batcher(model, max_running=2)
    for i, adapter in enumerate(("fr", None, "de")):
        engine.submit(i, GenerationRequest(PROMPTS[i], 5, temperature=0, adapter=adapter))
    assert engine.stats().waiting_adapters == ("de", "fr") and engine.stats().running_adapters == ()
    engine.step()  # two of them join the batch; the third waits for room
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (2, 1)
    assert stats.running_adapters == ("fr",) and stats.waiting_adapters == ("de",)
    while engine.busy:
        engine.step()
    assert engine.stats().running_adapters == () and engine.stats().waiting_adapters == ()


def test_sequences_with_different_adapters_share_a_batch_and_each_gets_its_solo_tokens(tmp_path):
    from transformers import AutoModelForCausalLM

    from agent.artifacts import read_model_dir
    from agent.workers.adapter_pool import AdapterPool
    from agent.workers.continuous import ContinuousBatcher
    from agent.workers.demo_models import build_tiny_llama
    from tests.adapter_files import write_adapter

    base = build_tiny_llama(tmp_path / "base")
    layers = {f"model.layers.{i}.self_attn.{p}_proj": (8, 64, 64) for i in (0, 1) for p in ("q", "o")}
    # A large alpha, so each adapter really changes what the model says.
    paths = {name: write_adapter(tmp_path / name, layers, r=8, lora_alpha=512, seed=seed)
             for seed, name in enumerate(("x", "y"))}
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    pool = AdapterPool(model, gpu_budget=1 << 20, cpu_budget=1 << 20, base=read_model_dir(base))
    for name, path in paths.items():
        pool.load(name, path)

    def engine():
        return ContinuousBatcher(model, pool.serving, max_positions=256, eos_ids=())

    names = ["x", None, "y", "x"]
    requests = [GenerationRequest(p, 10, temperature=0, adapter=a) for p, a in zip(PROMPTS, names, strict=True)]
    together = run(engine(), requests, join_after={3: 2})[1]
    alone = [run(engine(), [r])[1][0] for r in requests]
    assert [together[i].token_ids for i in range(4)] == [a.token_ids for a in alone]
    assert alone[0].token_ids != run(engine(), [GenerationRequest(PROMPTS[0], 10, temperature=0)])[1][0].token_ids


def test_a_newcomers_first_token_is_handed_out_before_the_running_batch_decodes(model):
    engine = batcher(model)
    engine.submit(0, GenerationRequest(PROMPTS[0], 10, temperature=0))
    engine.step()
    engine.submit(1, GenerationRequest(PROMPTS[1], 10, temperature=0))
    prefill, decode = engine.phases()
    assert [t.request_id for t in prefill.tokens] == [1]  # before the running batch's forward has run
    assert sorted(t.request_id for t in decode.tokens) == [0, 1]
