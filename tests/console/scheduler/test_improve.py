"""Memory-optimized's improvement search on its own: exact subset sums and the repack."""

from time import perf_counter

from console.scheduler.improve import Repack, best_subset, size_unit

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
