"""Memory-optimized's improvement search on its own: exact subset sums and the repack."""

import random
from time import perf_counter

import pytest

from console.scheduler import Deployment, Gpu, PlanInput, Settings, plan
from console.scheduler.improve import Repack, best_subset, exact_subset, size_unit

MiB = 2**20


def test_best_subset_finds_the_largest_sum_that_fits():
    weights = [7, 5, 4, 3]
    chosen = best_subset(weights, 12)
    assert sum(weights[i] for i in chosen) == 12


def test_best_subset_takes_nothing_when_nothing_fits():
    assert best_subset([5, 6], 4) == [] and best_subset([], 10) == []


def test_the_unit_is_the_common_divisor_when_fine_enough_else_a_rounded_fraction():
    assert size_unit([80 * 1024 * MiB], [300 * MiB, 1200 * MiB]) == 20 * MiB  # gcd(81920, 300, 1200) MiB
    coarse = size_unit([80 * 1024 * MiB + 1], [300 * MiB + 7])
    assert (80 * 1024 * MiB + 1) // coarse <= 2**17


def test_it_places_everything_on_an_exact_fit_instance_where_best_fit_decreasing_leaves_one_out():
    sizes = [5, 4, 4, 3, 2, 2]
    bfd = [0, 0, 1, 1, 1, None]  # best-fit decreasing: 5+4 and 4+3+2, one 2 left over
    search = Repack([10, 10], sizes, [None] * 6, bfd, seed=0)
    best, _, stopped = search.run(perf_counter() + 30, 1000)
    loads = [sum(s for s, b in zip(sizes, best, strict=True) if b == k) for k in (0, 1)]
    assert None not in best and loads == [10, 10] and stopped == "all placed"


def test_it_respects_which_gpus_each_replica_may_use():
    # The 6 may only go to GPU 1; the 4 and 2 then have to share GPU 0.
    search = Repack([10, 10], [6, 4, 4, 2], [{1}, None, None, None], [None, 0, 1, 0], seed=0)
    best, _, _ = search.run(perf_counter() + 30, 1000)
    assert best[0] == 1 and None not in best
    for k in (0, 1):
        assert sum(s for s, b in zip([6, 4, 4, 2], best, strict=True) if b == k) <= 10


def test_it_improves_a_poor_assignment_and_stays_within_capacity():
    # Started with a 5 on each bin, the 6 fits nowhere unless one 5 moves over: the search must move it
    # (5+5 on one bin, 6+4 on the other) to place everything.
    sizes = [5, 5, 6, 4]
    best, _, _ = Repack([10, 10], sizes, [None] * 4, [0, 1, None, None], seed=1).run(perf_counter() + 30, 300)
    assert None not in best
    for k in (0, 1):
        assert sum(s for s, b in zip(sizes, best, strict=True) if b == k) <= 10


# --- exact bytes: sizes that share no useful common divisor -------------------------------------------------------

GiB = 2**30


def fills_to_the_byte(seed: int, gpus: int, per_gpu: tuple[int, int]) -> tuple[list[int], int]:
    """(sizes, GPU total) of an instance whose only way to place everything fills every GPU to the byte: a GPU total
    in arbitrary bytes, each GPU cut at random byte offsets into per_gpu[0]..per_gpu[1] models of at least 1 GiB,
    shuffled over the fleet."""
    rng = random.Random(seed)
    total = 80 * GiB - rng.randrange(1, 2**26)
    sizes = []
    for _ in range(gpus):
        k = rng.randint(*per_gpu)
        while True:
            cuts = sorted(rng.sample(range(1, total), k - 1))
            parts = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
            if min(parts) >= GiB:
                break
        sizes += parts
    rng.shuffle(sizes)
    return sizes, total


@pytest.mark.parametrize("per_gpu", [(3, 3), (4, 4), (2, 4)])
def test_memory_optimized_places_everything_when_the_optimum_fills_gpus_to_the_byte(per_gpu):
    # Rounding sizes up to 1/131072 of a GPU made such a fill look one unit too full, so one model stayed out.
    for seed in range(5):
        sizes, total = fills_to_the_byte(seed, 8, per_gpu)
        assert size_unit([total], sizes) > 1  # the search counts in coarse units here
        gpus = tuple(Gpu(f"h{i // 4}/{i % 4}", f"h{i // 4}", total) for i in range(8))
        deployments = tuple(Deployment(f"m{i:02d}", s) for i, s in enumerate(sizes))
        result = plan(PlanInput(gpus, deployments, settings=Settings(search_budget_s=60, search_iterations=2000)))
        assert not result.unplaced, (seed, [u.reason for u in result.unplaced])
        assert all(b.free_bytes == 0 for b in result.ledger)  # every GPU full to the byte, none past it


def test_exact_subset_finds_the_fill_to_the_byte_that_rounding_hides():
    unit = 1000
    sizes = [2400, 3300, 4300, 2999, 1]  # 2400 + 3300 + 4300 = 10000 exactly; in whole units 2 + 3 + 4 = 9
    chosen = exact_subset(sizes, unit, 10_000)
    assert sorted(sizes[i] for i in chosen) == [2400, 3300, 4300]


def test_exact_subset_never_returns_more_bytes_than_fit():
    rng = random.Random(3)
    for _ in range(50):
        sizes = [rng.randrange(1, 5000) for _ in range(12)]
        limit = rng.randrange(1, 20_000)
        chosen = exact_subset(sizes, 97, limit)
        assert len(set(chosen)) == len(chosen) and sum(sizes[i] for i in chosen) <= limit


def test_the_result_is_verified_in_bytes_and_what_the_search_added_past_capacity_leaves():
    search = Repack([10, 10], [6, 5, 4], [None] * 3, [0, None, None], seed=0)
    repaired = search.verified([0, 0, 1])  # 6 + 5 on GPU 0 would be 11 bytes in 10
    assert repaired == [0, None, 1]  # the 6 was there before the search: the 5 it added leaves
