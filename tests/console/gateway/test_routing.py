"""Replica choice: least outstanding requests, and consistent hashing with bounded loads for adapters."""

from collections import Counter

from console.gateway.routing import affinity_choice, bounded_load_bound, least_outstanding


def test_least_outstanding_picks_the_idlest_replica():
    assert least_outstanding([1, 2, 3], {1: 4, 2: 1, 3: 2}) == 2


def test_least_outstanding_rotates_among_equally_idle_replicas():
    picks = {least_outstanding([1, 2, 3], {}, turn) for turn in range(3)}
    assert picks == {1, 2, 3}


def test_an_adapter_maps_to_the_same_replica_while_loads_allow():
    replicas = [10, 11, 12, 13]
    assert len({affinity_choice("support-bot", replicas, {}) for _ in range(50)}) == 1


def test_different_adapters_spread_over_the_replicas():
    replicas = [10, 11, 12, 13]
    homes = Counter(affinity_choice(f"adapter-{i}", replicas, {}) for i in range(400))
    assert set(homes) == set(replicas)
    assert max(homes.values()) < 2 * min(homes.values())  # roughly even: no replica takes most adapters


def test_a_hot_adapter_spills_to_the_next_replica_and_no_replica_exceeds_the_bound():
    replicas = [1, 2, 3, 4]
    outstanding: dict[int, int] = {}
    for _ in range(40):  # one adapter's burst, nobody finishing
        total = sum(outstanding.values())
        chosen = affinity_choice("hot", replicas, outstanding)
        outstanding[chosen] = outstanding.get(chosen, 0) + 1
        assert outstanding[chosen] <= bounded_load_bound(total, len(replicas))
    assert len(outstanding) == 4  # it spread over every replica
    assert max(outstanding.values()) <= 1.25 * 40 / 4 + 1


def test_removing_a_replica_moves_only_its_adapters():
    before = {f"a{i}": affinity_choice(f"a{i}", [1, 2, 3, 4], {}) for i in range(200)}
    after = {name: affinity_choice(name, [1, 2, 3], {}) for name in before}
    moved = [n for n in before if before[n] != after[n]]
    assert moved and all(before[n] == 4 for n in moved)
