"""The built-in engine's prefix cache (imports torch): a prompt that shares a cached prefix prefills only the rest of
it, and every greedy output is what the engine gives without the cache."""

import pytest

from agent.workers.generation_spec import GenerationRequest
from tests.agent.workers.test_continuous import reference, run
from tests.agent.workers.tiny_batcher import batcher

torch = pytest.importorskip("torch")

from agent.workers.prefix_cache import BLOCK, PrefixCache, block_names  # noqa: E402 (after the torch check)

SHARED = tuple(range(3, 3 + 70))  # 70 tokens: four full blocks of 16, and six more
MIB = 1 << 20


def cached(model, capacity=64 * MIB, **kwargs):
    return batcher(model, prefix_cache=PrefixCache(capacity), **kwargs)


def greedy(prompt, n=8, **kwargs):
    return GenerationRequest(tuple(prompt), n, temperature=0, **kwargs)


def test_a_second_prompt_with_a_shared_prefix_prefills_only_its_suffix(model):
    first, second = greedy(SHARED + (500, 501, 502)), greedy(SHARED + (900, 901, 902, 903, 904))
    engine = cached(model)
    _, done_first, _ = run(engine, [first])
    before = engine.stats().prefill_tokens
    assert before == 73
    _, done, failed = run(engine, [second])
    stats = engine.stats()
    assert not failed
    # 64 tokens (four blocks) came from the cache: 70 - 64 + 5 were computed.
    assert stats.prefill_tokens - before == len(second.input_ids) - 64 == 11
    assert (stats.prefix_hits, stats.prefix_misses, stats.prefix_hit_tokens) == (1, 1, 64)
    plain = batcher(model)
    _, alone, _ = run(plain, [second])
    assert done[0].token_ids == alone[0].token_ids == tuple(reference(model, second.input_ids, 8))
    assert done_first[0].token_ids == tuple(reference(model, first.input_ids, 8))


def test_prompts_sharing_prefixes_in_a_running_batch_get_what_they_get_without_the_cache(model):
    other = tuple(range(600, 600 + 40))
    requests = [greedy(SHARED + (11, 12)), greedy(other + (13,), 12), greedy(SHARED + (14, 15, 16), 5),
                greedy(other + (17, 18), 9), greedy(SHARED[:48] + (19,), 7), greedy(SHARED + (20,), 10)]
    joins = {2: 2, 3: 3, 4: 4, 5: 9}  # later ones join while earlier ones decode
    engine = cached(model, token_budget=64)
    streamed, done, failed = run(engine, requests, join_after=joins)
    _, without, _ = run(batcher(model, token_budget=64), requests, join_after=joins)
    assert not failed
    assert {rid: r.token_ids for rid, r in done.items()} == {rid: r.token_ids for rid, r in without.items()}
    assert all(streamed[rid] == list(done[rid].token_ids) for rid in done)
    stats = engine.stats()
    assert stats.prefix_hits == 4 and stats.prefix_hit_tokens == 64 + 32 + 48 + 64
    total = sum(len(r.input_ids) for r in requests)
    assert stats.prefill_tokens == total - stats.prefix_hit_tokens


def test_a_prefix_is_its_adapters_own():
    names = block_names(SHARED, None, 2)
    assert names != block_names(SHARED, "fr", 2) != block_names(SHARED, "de", 2)
    assert names[0] == block_names(SHARED[:16] + (999,) * 16, None, 2)[0] and names[1] != block_names(
        SHARED[:16] + (999,) * 16, None, 2)[1]  # a chain: block 1's name covers block 0 too
    cache = PrefixCache(MIB)
    cache.store(SHARED, "fr", kv(len(SHARED)), 0)
    assert cache.lookup(SHARED, None) == (0, None) and cache.lookup(SHARED, "de") == (0, None)
    assert cache.lookup(SHARED, "fr")[0] == 64
    cache.forget("fr")
    assert cache.lookup(SHARED, "fr") == (0, None) and cache.bytes == 0


def test_a_lookup_returns_the_stored_kv_and_leaves_the_last_token_to_compute():
    cache = PrefixCache(MIB)
    layers = kv(48)
    cache.store(SHARED[:48], None, layers, 0)
    assert cache.blocks == 3
    tokens, found = cache.lookup(SHARED[:48], None)  # the whole prompt is cached, but its last token must run
    assert tokens == 32
    assert torch.equal(found[1][0], layers[1][0][:, :, :32]) and torch.equal(found[0][1], layers[0][1][:, :, :32])
    tokens, found = cache.lookup(SHARED[:49], None)
    assert tokens == 48 and torch.equal(found[1][1], layers[1][1])
    assert cache.lookup(SHARED[:16], None) == (0, None)  # nothing before its last token: neither hit nor miss
    assert (cache.hits, cache.misses, cache.hit_tokens) == (2, 0, 80)


def test_least_recently_used_blocks_go_first_and_a_prefix_loses_its_tail_first():
    one_block = sum(k.nbytes + v.nbytes for k, v in kv(BLOCK))
    cache = PrefixCache(5 * one_block)
    a, b = SHARED[:64], tuple(range(700, 764))
    cache.store(a, None, kv(64), 0)
    cache.store(b, None, kv(64), 0)  # 8 blocks for 5: a's go, its tail before its head
    assert cache.bytes == 5 * one_block and cache.lookup(a + (1,), None)[0] == 16
    assert cache.lookup(b + (1,), None)[0] == 64
    cache.fit(running_bytes=2 * one_block)  # running sequences took some of the share: a, then b's tail
    assert cache.bytes == 3 * one_block and cache.lookup(b + (1,), None)[0] == 48
    assert cache.lookup(a + (1,), None) == (0, None)


def test_the_cache_keeps_within_the_kv_share_that_running_sequences_leave(model):
    engine = cached(model, capacity=1)  # no room: running sequences' KV alone fills the share
    run(engine, [greedy(SHARED), greedy(SHARED + (5,))])
    assert engine.stats().prefix_cache_bytes == 0 and engine.stats().prefix_hits == 0


def test_a_prompt_asking_for_its_log_probabilities_runs_whole(model):
    engine = cached(model)
    run(engine, [greedy(SHARED)])
    request = greedy(SHARED + (7, 8), prompt_logprobs=1)
    engine.submit(0, request)
    first = engine.step().tokens[0]
    assert engine.stats().prefix_hits == 0 and engine.stats().prefill_tokens == 70 + 72
    plain = batcher(model)
    plain.submit(0, request)
    assert first == plain.step().tokens[0] and len(first.prompt_logprobs) == 72


def kv(tokens, layers=2, heads=2, size=4):
    """Distinct keys and values for `tokens` positions in each of `layers` layers."""
    def one(seed):
        return torch.arange(tokens * heads * size, dtype=torch.float32).reshape(1, heads, tokens, size) + seed
    return [(one(1000 * i), one(1000 * i + 500)) for i in range(layers)]


def test_a_replica_keeps_prefixes_per_adapter_within_its_kv_share_and_drops_them_to_sleep(tmp_path):
    from agent.workers.demo_models import build_tiny_llama
    from agent.workers.runtime import load
    from agent.workers.spec import WorkerSpec
    from tests.adapter_files import write_adapter

    base = build_tiny_llama(tmp_path / "base")
    layers = {f"model.layers.{i}.self_attn.{p}_proj": (8, 64, 64) for i in (0, 1) for p in ("q", "o")}
    adapter = write_adapter(tmp_path / "x", layers, r=8, lora_alpha=512, seed=1)
    replica = load(WorkerSpec(1, str(base), "causal-lm", batch=4))
    grant = {"gpu_budget": 1 << 20, "cpu_budget": 1 << 20, "load": [{"name": "x", "path": str(adapter)}]}
    replica.configure_adapters(grant)
    engine = replica.batcher
    assert engine.prefix_cache.capacity_bytes == replica.kv_capacity_bytes() > 0

    def hits(*requests):
        before = engine.stats().prefix_hits
        outputs = [run(engine, [r])[1][0].token_ids for r in requests]
        return engine.stats().prefix_hits - before, outputs

    with_x, base_only = greedy(SHARED + (1,), adapter="x"), greedy(SHARED + (2,))
    assert hits(with_x, with_x)[0] == 1
    assert hits(base_only)[0] == 0  # x's prefix is not the base model's
    count, (again,) = hits(with_x)
    assert count == 1 and again != hits(base_only)[1][0]
    replica.configure_adapters(grant)  # x loaded again: its weights may have changed
    assert hits(with_x)[0] == 0
    stats = engine.stats()
    assert 0 < stats.prefix_cache_bytes <= replica.kv_capacity_bytes()
    replica.sleep()
    assert engine.stats().prefix_cache_bytes == 0
    replica.wake()
    assert hits(base_only, base_only)[0] == 1


def test_out_of_memory_copying_a_prefix_empties_the_cache_and_the_sequence_goes_on(model, monkeypatch):
    engine = cached(model)
    run(engine, [greedy(SHARED)])
    assert engine.stats().prefix_cache_bytes > 0

    def no_memory(*args, **kwargs):
        raise MemoryError("cannot allocate")

    monkeypatch.setattr(engine.prefix_cache, "lookup", no_memory)
    request = greedy(SHARED + (9,))
    _, done, failed = run(engine, [request])
    assert not failed and done[0].token_ids == tuple(reference(model, request.input_ids, 8))
    assert engine.stats().prefill_tokens == 70 + 71  # prefilled whole, then stored again
    monkeypatch.setattr(engine.prefix_cache, "store", no_memory)
    _, done, failed = run(engine, [greedy(SHARED + (10,))])
    assert not failed and engine.stats().prefix_cache_bytes == 0


def test_stats_from_a_worker_without_the_prefix_cache_read_as_none_of_it():
    import pickle

    from agent.workers.generation_spec import EngineStats

    older = EngineStats.__new__(EngineStats)  # what an older worker pickles: its fields only
    older.__dict__.update(running=2, waiting=1, kv_cache_bytes=10, running_adapters=(), waiting_adapters=())
    stats = pickle.loads(pickle.dumps(older))
    assert stats.running == 2
    assert (stats.prefill_tokens, stats.prefix_hits, stats.prefix_misses, stats.prefix_hit_tokens,
            stats.prefix_cache_bytes) == (0, 0, 0, 0, 0)
