"""Unit tests per strategy and per priority phase, each a JSON fixture: a dry-run document and what to expect."""

import json
from pathlib import Path

import pytest

from console.scheduler.dryrun import parse_input
from console.scheduler.planner import plan

FIXTURES = Path(__file__).parent / "fixtures"


def check(name: str) -> None:
    fixture = json.loads((FIXTURES / f"{name}.json").read_text())
    doc, expect = fixture["input"], fixture["expect"]
    doc.setdefault("search_iterations", 2000)  # deterministic improvement search
    doc.setdefault("search_budget_s", 30)
    result = plan(parse_input(doc))
    by_key = {f"{r.deployment}#{r.index}": r for r in result.replicas}
    for key, gpus in expect.get("ready", {}).items():
        assert by_key[key].state == "ready" and list(by_key[key].gpus) == gpus, (key, by_key[key])
    for key, action in expect.get("actions", {}).items():
        assert by_key[key].action == action, (key, by_key[key])
    for key, state in expect.get("states", {}).items():
        assert by_key[key].state == state, (key, by_key[key])
    if "unplaced" in expect:
        assert sorted(f"{u.deployment}#{u.index}" for u in result.unplaced) == sorted(expect["unplaced"])
    unplaced = {f"{u.deployment}#{u.index}": u.reason for u in result.unplaced}
    for key, words in expect.get("reasons", {}).items():
        reason = unplaced.get(key) or by_key[key].reason
        assert words in reason, (key, reason)
    if "moves" in expect:
        assert len(result.moves) == expect["moves"]
    if "gpus_used" in expect:
        assert result.gpus_used == expect["gpus_used"]
    targets = {s.deployment: s.target for s in result.scale}
    for name, target in expect.get("scale", {}).items():
        assert targets[name] == target


def test_every_fixture_has_a_test():
    names = {p.stem for p in FIXTURES.glob("*.json")}
    tested = {n.removeprefix("test_it_") for n in globals() if n.startswith("test_it_")}
    assert names <= tested, names - tested


def test_it_fill_first_packs_the_busiest_gpu():
    check("fill_first_packs_the_busiest_gpu")


def test_it_memory_optimized_takes_the_tightest_fit():
    check("memory_optimized_takes_the_tightest_fit")


def test_it_memory_optimized_repacks_what_best_fit_cannot_place():
    check("memory_optimized_repacks_what_best_fit_cannot_place")


def test_it_balance_spreads_over_hosts_then_gpus():
    check("balance_spreads_over_hosts_then_gpus")


def test_it_latency_sensitive_keeps_critical_replicas_apart():
    check("latency_sensitive_keeps_critical_replicas_apart")


def test_it_gangs_stay_on_one_host():
    check("gangs_stay_on_one_host")


def test_it_selectors_restrict_gpus_and_say_so():
    check("selectors_restrict_gpus_and_say_so")


def test_it_priority_places_minimums_in_tier_order():
    check("priority_places_minimums_in_tier_order")


def test_it_priority_preempts_lower_tiers_for_a_violated_slo():
    check("priority_preempts_lower_tiers_for_a_violated_slo")


def test_it_priority_never_preempts_an_equal_or_higher_tier():
    check("priority_never_preempts_an_equal_or_higher_tier")


def test_it_batch_takes_the_leftovers():
    check("batch_takes_the_leftovers")


def test_it_scale_down_waits_for_the_quiet_window_and_the_cooldown():
    check("scale_down_waits_for_the_quiet_window_and_the_cooldown")


def test_it_temporal_swap_puts_the_idle_replica_to_sleep():
    check("temporal_swap_puts_the_idle_replica_to_sleep")


def test_it_a_sleeping_replica_wakes_on_its_own_host():
    check("a_sleeping_replica_wakes_on_its_own_host")


@pytest.mark.parametrize("strategy", ["fill-first", "balance", "memory-optimized", "latency-sensitive"])
def test_it_places_the_minimal_example_of_the_issue_with_every_strategy(strategy):
    doc = {"gpus": [{"id": "h1/0", "host": "h1", "total_bytes": 85899345920}],
           "deployments": [{"name": "m1", "bytes": 1300000000, "replicas": 1}]}
    result = plan(parse_input(doc, strategy))
    assert [(r.deployment, r.gpus) for r in result.replicas] == [("m1", ("h1/0",))]


def test_it_spread_puts_replicas_in_different_zones():
    check("spread_puts_replicas_in_different_zones")


def test_it_taints_keep_a_pool_for_tolerating_deployments():
    check("taints_keep_a_pool_for_tolerating_deployments")
