"""The adapter pool: its torch-free policy (budgets, LRU, pinning, prefetch, refusals, stats), then its tensors."""

from __future__ import annotations

import pytest

from agent.workers.adapter_tiers import CPU, DISK, GPU, AdapterRefused, AdapterTiers, Move
from tests.adapter_files import write_adapter


def tiers_with(gpu=300, cpu=300, **sizes) -> AdapterTiers:
    tiers = AdapterTiers(gpu, cpu, half_life_s=60)
    for name, nbytes in sizes.items():
        tiers.add(name, nbytes, now=0)
    return tiers


def where(tiers: AdapterTiers) -> dict[str, str]:
    return {name: a.tier for name, a in tiers.adapters.items()}


def test_a_new_adapter_goes_to_the_device_while_it_has_room_then_to_the_host():
    tiers = tiers_with(a=100, b=100, c=100)
    assert tiers.add("d", 100, now=0) == [Move("d", DISK, CPU)]
    assert where(tiers) == {"a": GPU, "b": GPU, "c": GPU, "d": CPU}
    assert (tiers.used(GPU), tiers.used(CPU)) == (300, 100)


def test_the_device_tier_evicts_the_least_recently_used_to_the_host():
    tiers = tiers_with(a=100, b=100, c=100, d=100)
    tiers.acquire(["b"], now=1)
    tiers.acquire(["a"], now=2)
    # c is now the least recently used on the device.
    assert tiers.acquire(["d", "d"], now=3) == [Move("c", GPU, CPU), Move("d", CPU, GPU)]
    assert tiers.acquire(["c"], now=4) == [Move("b", GPU, CPU), Move("c", CPU, GPU)]
    assert where(tiers) == {"a": GPU, "b": CPU, "c": GPU, "d": GPU}


def test_adapters_cost_their_real_bytes_so_a_big_one_pushes_out_several_small_ones():
    tiers = tiers_with(gpu=300, cpu=600, s1=50, s2=50, s3=50, s4=50)
    tiers.add("big", 250, now=0)
    assert tiers.acquire(["big"], now=1) == [
        Move("s1", GPU, CPU), Move("s2", GPU, CPU), Move("s3", GPU, CPU), Move("big", CPU, GPU),
    ]
    assert tiers.used(GPU) == 300


def test_a_full_host_tier_drops_its_least_recently_used_to_disk():
    tiers = tiers_with(gpu=200, cpu=200, a=100, b=100, c=100, d=100)
    assert where(tiers) == {"a": GPU, "b": GPU, "c": CPU, "d": CPU}
    # d comes up, a (the device's least recently used) goes down, and the full host tier drops c.
    assert tiers.acquire(["d"], now=1) == [Move("c", CPU, DISK), Move("a", GPU, CPU), Move("d", CPU, GPU)]
    assert where(tiers) == {"a": CPU, "b": GPU, "c": DISK, "d": GPU}


def test_eviction_order_through_both_tiers_is_least_recently_used_first():
    tiers = tiers_with(gpu=100, cpu=100, a=100, b=100)
    assert where(tiers) == {"a": GPU, "b": CPU}
    tiers.add("c", 100, now=0)  # the host tier is full: b (older) is dropped to disk
    assert where(tiers) == {"a": GPU, "b": DISK, "c": CPU}
    # Bringing b back: a is demoted to the host, which drops c, the host's least recently used.
    assert tiers.acquire(["b"], now=1) == [Move("c", CPU, DISK), Move("a", GPU, CPU), Move("b", DISK, GPU)]
    assert tiers.totals().evictions == 3 and tiers.totals().disk_loads == 4


def test_a_demoted_adapter_skips_the_host_when_only_adapters_of_the_same_batch_are_there():
    tiers = tiers_with(gpu=200, cpu=100, a=100, b=100, c=100)
    assert where(tiers) == {"a": GPU, "b": GPU, "c": CPU}
    moves = tiers.acquire(["b", "c"], now=1)
    assert moves == [Move("a", GPU, DISK), Move("c", CPU, GPU)]


def test_a_pinned_adapter_is_never_evicted():
    tiers = tiers_with(a=100, b=100, c=100, d=100)
    assert tiers.pin("a") == []
    tiers.acquire(["b"], now=1)
    tiers.acquire(["c"], now=2)
    tiers.acquire(["d"], now=3)  # a is the least recently used but pinned: b goes
    assert where(tiers) == {"a": GPU, "b": CPU, "c": GPU, "d": GPU}
    tiers.unpin("a")
    tiers.acquire(["b"], now=4)
    assert tiers.tier_of("a") == CPU


def test_pinning_an_adapter_on_the_host_brings_it_to_the_device():
    tiers = tiers_with(a=100, b=100, c=100, d=100)
    assert tiers.pin("d") == [Move("a", GPU, CPU), Move("d", CPU, GPU)]
    assert tiers.adapters["d"].pinned


def test_it_refuses_a_pin_that_cannot_fit_and_says_why():
    tiers = tiers_with(gpu=3_000_000, cpu=9_000_000, a=1_000_000, b=1_000_000, c=1_500_000)
    tiers.pin("a")
    tiers.pin("b")
    message = r"cannot pin 'c' \(1.5 MB\): 2.0 MB of the 3.0 MB device tier is already pinned"
    with pytest.raises(AdapterRefused, match=message):
        tiers.pin("c")
    assert not tiers.adapters["c"].pinned and tiers.tier_of("c") == CPU


def test_it_refuses_an_adapter_bigger_than_a_tier():
    tiers = AdapterTiers(4_000_000, 2_000_000)
    with pytest.raises(AdapterRefused, match=r"'huge' needs 5.0 MB, more than the whole device tier \(4.0 MB\)"):
        tiers.add("huge", 5_000_000)
    with pytest.raises(AdapterRefused, match=r"'big' needs 3.0 MB, more than the whole host tier \(2.0 MB\)"):
        tiers.add("big", 3_000_000)
    assert tiers.adapters == {}


def test_it_refuses_a_batch_whose_adapters_cannot_share_the_device():
    tiers = tiers_with(gpu=3_000_000, cpu=9_000_000, p=1_000_000, a=1_000_000, b=1_000_000, c=1_000_000)
    tiers.pin("p")
    message = (r"this batch needs 3 adapters \(a, b, c; 3.0 MB\) on the device at once; the device tier holds "
               r"3.0 MB, 1.0 MB of it pinned by p; split the batch")
    with pytest.raises(AdapterRefused, match=message):
        tiers.acquire(["a", "b", "c", "a"], now=1)
    assert tiers.acquire(["a", "b"], now=1) == []
    with pytest.raises(AdapterRefused, match="adapter 'nope' is not loaded in this pool"):
        tiers.acquire(["a", "nope"])
    with pytest.raises(AdapterRefused, match="already loaded"):
        tiers.add("a", 1)


def test_hits_misses_and_requests_are_counted_per_adapter_and_in_total():
    tiers = tiers_with(gpu=200, cpu=200, a=100, b=100, c=100)
    tiers.acquire(["a", "a", None, "b"], now=1)  # both on the device: two hits
    tiers.acquire(["c", "c", "c"], now=2)  # a miss, which evicts a
    tiers.acquire(["a"], now=3)  # a miss again
    a, c = tiers.adapters["a"], tiers.adapters["c"]
    assert (a.requests, a.hits, a.misses) == (3, 1, 1)
    assert (c.requests, c.hits, c.misses) == (3, 0, 1)
    totals = tiers.totals()
    assert (totals.hits, totals.misses, totals.evictions) == (2, 2, 2)
    assert (totals.gpu_bytes, totals.cpu_bytes, totals.adapters) == (200, 100, 3)
    tiers.record_swap("a", 0.002)
    assert (a.swap_ins, a.last_swap_seconds) == (1, 0.002)


def test_prefetch_promotes_the_most_requested_adapters_first():
    tiers = tiers_with(gpu=200, cpu=1000, a=100, b=100, x=100, y=100, z=100)
    tiers.acquire(["a"], now=0)
    tiers.acquire(["b"], now=0)
    # Demand with no device room for it: x is wanted most, then z; a and b hold the device.
    tiers.hint({"x": 9, "z": 5, "y": 0.5}, now=0)
    moves = tiers.prefetch(now=0)
    assert [m for m in moves if m.target == GPU] == [Move("x", CPU, GPU), Move("z", CPU, GPU)]
    assert where(tiers)["x"] == where(tiers)["z"] == GPU
    # y (0.5) is less wanted than what is now on the device: nothing moves.
    assert tiers.prefetch(now=0) == []


def test_prefetch_never_evicts_a_more_popular_or_pinned_adapter():
    tiers = tiers_with(gpu=200, cpu=1000, hot=100, pinned=100, cold=100)
    tiers.acquire(["hot"] * 10, now=0)
    tiers.pin("pinned")
    assert tiers.tier_of("hot") == GPU
    tiers.hint({"cold": 5}, now=0)
    assert tiers.prefetch(now=0) == []
    assert tiers.tier_of("cold") == CPU


def test_request_counts_decay_so_recent_demand_wins():
    tiers = tiers_with(gpu=100, cpu=1000, old=100, new=100, filler=100)
    tiers.acquire(["old"] * 8, now=0)
    tiers.acquire(["new"] * 3, now=120)  # two half-lives later old's 8 count as 2
    tiers.acquire(["filler"], now=120)
    scores = tiers.scores(now=120)
    assert scores["old"] == pytest.approx(2.0) and scores["new"] == pytest.approx(3.0)
    moves = tiers.prefetch(now=120)
    assert moves[-1] == Move("new", CPU, GPU)


def test_hints_for_adapters_the_pool_does_not_hold_are_returned():
    tiers = tiers_with(a=100)
    assert tiers.hint({"a": 1, "elsewhere": 3}, now=0) == ["elsewhere"]


def test_an_adapter_whose_move_failed_counts_as_on_disk():
    tiers = tiers_with(a=100)
    tiers.lost("a")
    assert tiers.tier_of("a") == DISK and tiers.used(GPU) == 0
    assert tiers.acquire(["a"], now=1) == [Move("a", DISK, GPU)]


# -- the torch side ---------------------------------------------------------------------------------

Q = "model.layers.{}.self_attn.q_proj"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("torch")
    from agent.workers.demo_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("llama") / "base")


def pool_on(base, gpu, cpu):
    from transformers import AutoModelForCausalLM

    from agent.artifacts import read_model_dir
    from agent.workers.adapter_pool import AdapterPool

    model = AutoModelForCausalLM.from_pretrained(base).eval()
    return model, AdapterPool(model, gpu_budget=gpu, cpu_budget=cpu, base=read_model_dir(base))


def adapters(tmp_path, ranks):
    return {f"r{r}": write_adapter(tmp_path / f"r{r}", {Q.format(i): (r, 64, 64) for i in (0, 1)}, r=r, seed=r)
            for r in ranks}


def test_the_pool_keeps_outputs_right_through_demotions_and_disk_reloads(tiny_llama, tmp_path):
    import torch

    paths = adapters(tmp_path, (4, 8, 16))
    per_adapter = {r: 2 * r * 128 * 4 for r in (4, 8, 16)}  # fp32 bytes
    model, pool = pool_on(tiny_llama, gpu=per_adapter[16] + per_adapter[8], cpu=per_adapter[16])
    for name, path in paths.items():
        pool.load(name, path)
    ids = torch.arange(6).repeat(2, 1)  # the same tokens in both rows

    def run(names):
        with torch.inference_mode(), pool.serving(names):
            return model(input_ids=ids).logits

    first = {name: run([name, None]) for name in paths}  # every swap path: device, host and disk
    assert pool.stats()["totals"]["evictions"] > 0
    again = {name: run([None, name]) for name in reversed(list(paths))}
    for name in paths:
        torch.testing.assert_close(again[name][1], first[name][0], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(first["r4"][0], first["r8"][0])
    stats = pool.stats()
    assert stats["totals"]["disk_loads"] > len(paths)  # something was dropped and read again
    assert stats["totals"]["swap_ms_p50"] is not None
    rows = {row["name"]: row for row in stats["adapters"]}
    assert rows["r16"]["nbytes"] == per_adapter[16] and rows["r16"]["requests"] == 2


def test_the_pool_refuses_an_adapter_for_another_model_and_keeps_nothing_of_it(tiny_llama, tmp_path):
    from agent.artifacts import ArtifactError

    _, pool = pool_on(tiny_llama, gpu=1 << 20, cpu=1 << 20)
    wrong = write_adapter(tmp_path / "wrong", {Q.format(0): (8, 128, 64)})
    with pytest.raises(ArtifactError, match="in=128, out=64; the base model's tensor is"):
        pool.load("wrong", wrong)
    assert pool.stats()["adapters"] == []


def test_unloading_frees_the_slot_and_loading_the_same_path_twice_is_a_no_op(tiny_llama, tmp_path):
    paths = adapters(tmp_path, (4, 8))
    _, pool = pool_on(tiny_llama, gpu=1 << 20, cpu=1 << 20)
    pool.load("r4", paths["r4"], pin=True)
    assert pool.load("r4", paths["r4"])["pinned"]
    with pytest.raises(AdapterRefused, match="already loaded"):
        pool.load("r4", paths["r8"])
    pool.load("r8", paths["r8"])
    assert pool.acquire(["r8", "r4", None]) == [1, 0, None]
    pool.unload("r4")
    assert 0 not in pool.slots
    with pytest.raises(AdapterRefused, match="'r4' is not loaded"):
        pool.acquire(["r4"])
