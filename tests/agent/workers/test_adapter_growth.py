"""A running worker's adapter pool grows when the console grants it more: the budgets its pool was made with are
not the last word, so an adapter larger than the first one loads instead of being refused for the rest of the
worker's life (the probe: "needs X MB, more than the whole device tier", then 400 "not loaded in this replica")."""

from __future__ import annotations

import resource

import pytest

from agent.workers import limits
from agent.workers.adapter_tiers import CPU, GPU, AdapterRefused, AdapterTiers
from agent.workers.spec import WorkerSpec
from tests.adapter_files import write_adapter

Q = "model.layers.{}.self_attn.q_proj"


def test_growing_the_tiers_makes_room_for_an_adapter_bigger_than_the_old_budget():
    tiers = AdapterTiers(100, 400)
    tiers.add("small", 100, now=0)
    with pytest.raises(AdapterRefused, match="more than the whole device tier"):
        tiers.add("big", 300, now=0)
    assert tiers.grow(400, 1600) == {GPU: (100, 400), CPU: (400, 1600)}
    tiers.add("big", 300, now=0)
    assert {n: a.tier for n, a in tiers.adapters.items()} == {"small": GPU, "big": GPU}


def test_a_smaller_grant_leaves_the_budgets_as_they_are():
    # The scheduler never shrinks a running replica's reservation, so neither does its pool.
    tiers = AdapterTiers(400, 1600)
    assert tiers.grow(100, 400) == {}
    assert tiers.budgets == {GPU: 400, CPU: 1600}


class FakeCuda:
    def __init__(self):
        self.fractions = []

    def set_per_process_memory_fraction(self, fraction, device):
        self.fractions.append((round(fraction, 4), device))


class FakeTorch:
    def __init__(self):
        self.cuda = FakeCuda()


class FakeDevice:
    def __init__(self, kind):
        self.type = kind


def test_a_grown_reservation_raises_the_cuda_memory_fraction():
    torch = FakeTorch()
    spec = WorkerSpec(1, "/m", "causal-lm", "cuda:0", reserved_bytes=100, gpu_total_bytes=1000)
    line = limits.grow_memory_limits(spec, torch, FakeDevice("cuda"), 100, 250)
    assert [fraction for fraction, _ in torch.cuda.fractions] == [0.25]
    assert "memory fraction raised to 0.2500" in line and "250 reserved" in line
    assert limits.grow_memory_limits(spec, torch, FakeDevice("cuda"), 250, 200) == ""  # never lowered


def test_a_grown_reservation_raises_a_capped_cpu_workers_address_space_by_as_much(monkeypatch):
    caps = {"now": (5000, resource.RLIM_INFINITY)}
    monkeypatch.setattr(limits.resource, "getrlimit", lambda _what: caps["now"])
    monkeypatch.setattr(limits.resource, "setrlimit", lambda _what, value: caps.__setitem__("now", value))
    spec = WorkerSpec(1, "/m", "causal-lm", "cpu", reserved_bytes=100, memory_limit_bytes=900)
    line = limits.grow_memory_limits(spec, FakeTorch(), FakeDevice("cpu"), 100, 350)
    assert caps["now"] == (5250, resource.RLIM_INFINITY)
    assert "address space cap raised to 5250 bytes" in line
    uncapped = WorkerSpec(1, "/m", "causal-lm", "cpu", reserved_bytes=100)
    assert limits.grow_memory_limits(uncapped, FakeTorch(), FakeDevice("cpu"), 100, 350) == ""
    assert caps["now"] == (5250, resource.RLIM_INFINITY)


# -- the worker's runtime, with torch ----------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    pytest.importorskip("torch")
    from agent.workers.demo_models import build_tiny_llama
    from agent.workers.runtime import load

    path = build_tiny_llama(tmp_path_factory.mktemp("llama") / "base")
    return load(WorkerSpec(1, str(path), "causal-lm"))


def test_a_worker_takes_a_larger_adapter_once_the_console_grants_its_pool_more(loaded, tmp_path):
    import numpy as np

    small = write_adapter(tmp_path / "small", {Q.format(i): (2, 64, 64) for i in (0, 1)}, r=2, seed=1)
    big = write_adapter(tmp_path / "big", {Q.format(i): (32, 64, 64) for i in (0, 1)}, r=32, seed=2)
    small_bytes, big_bytes = 2 * 2 * 128 * 4, 2 * 32 * 128 * 4
    first = {"gpu_budget": small_bytes, "cpu_budget": 4 * small_bytes, "hints": {},
             "load": [{"name": "small", "path": str(small), "pinned": False}]}
    assert loaded.configure_adapters(first)["errors"] == []
    both = {"gpu_budget": small_bytes + big_bytes, "cpu_budget": 4 * (small_bytes + big_bytes), "hints": {},
            "load": first["load"] + [{"name": "big", "path": str(big), "pinned": False}]}
    answer = loaded.configure_adapters(both)
    assert answer["errors"] == []
    assert answer["stats"]["totals"]["gpu_budget"] == small_bytes + big_bytes
    ids = {"input_ids": np.array([[1, 5, 9]])}
    tuned = loaded.infer(ids, ["big"])["logits"]
    assert not np.allclose(tuned, loaded.infer(ids)["logits"])


def test_an_adapter_the_worker_cannot_load_is_reported_by_name_with_its_reason(loaded, tmp_path):
    answer = loaded.configure_adapters({"gpu_budget": 1 << 20, "cpu_budget": 1 << 22, "hints": {},
                                        "load": [{"name": "gone", "path": str(tmp_path / "gone"), "pinned": False}]})
    assert set(answer["failures"]) == {"gone"} and "no such directory" in answer["failures"]["gone"]
    assert answer["errors"] == [f"adapter 'gone': {answer['failures']['gone']}"]


def test_a_handle_keeps_each_adapters_failure_until_a_later_change_loads_it():
    import asyncio

    from agent.workers.handle import WorkerHandle

    handle = WorkerHandle(WorkerSpec(1, "/m", "causal-lm"), asyncio.Queue())
    stats = {"adapters": [], "totals": {"hits": 0, "misses": 0, "evictions": 0, "adapters": 0}}
    handle._take_adapter_stats({"stats": stats, "errors": ["adapter 'a': bad"], "failures": {"a": "bad"}})
    assert handle.adapter_failures == {"a": "bad"} and handle.adapter_error == "adapter 'a': bad"
    handle._take_adapter_stats({"stats": stats})  # a read of the pool's figures: nothing was loaded
    assert handle.adapter_failures == {"a": "bad"}
    handle._take_adapter_stats({"stats": stats, "errors": [], "failures": {}})
    assert handle.adapter_failures == {} and handle.adapter_error == ""
