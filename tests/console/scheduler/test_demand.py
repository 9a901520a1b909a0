"""Demand from the inference gateway: requests waiting wake, place or make room for one replica under the tier
rules, idle deployments scale to zero, and every demanded deployment is told served, waiting or refused."""

from dataclasses import replace

from console.scheduler import DemandOutcome, Deployment, Gpu, Host, PlanInput, Replica, Settings, plan
from console.scheduler.scaling import decide

GiB, MiB = 1024**3, 1024**2
NOW = 1000.0


def web(**changes) -> Deployment:
    """A standard deployment with min_replicas 0 and three requests waiting for it."""
    return replace(Deployment("web", 20 * GiB, replicas=0, min_replicas=0, max_replicas=1, demand=3), **changes)


def above_min(name: str, size: int = 20 * GiB, priority: str = "standard", replicas: int = 1,
              **changes) -> Deployment:
    """One replica that is above its minimum (min_replicas 0)."""
    return Deployment(name, size, replicas=replicas, min_replicas=0, max_replicas=1, priority=priority, **changes)


def run(gpus, deployments, replicas=(), ram=None, now=NOW, **settings):
    hosts = () if ram is None else tuple(Host(h, ram) for h in sorted({g.host for g in gpus}))
    return plan(PlanInput(tuple(gpus), tuple(deployments), tuple(replicas), hosts, now=now,
                          settings=Settings(**settings)))


def by_key(result):
    return {(r.deployment, r.index): r for r in result.replicas}


def outcome(result, name: str) -> DemandOutcome:
    [found] = [d for d in result.demands if d.deployment == name]
    return found


def next_pass(result, planned_at: float = NOW) -> tuple[Replica, ...]:
    """The replicas `result` leaves, as the console records them: placed, woken or moved ones ready since
    `planned_at` (the time of the pass that made `result`)."""
    return tuple(Replica(r.deployment, r.index, r.gpus, r.reserved_bytes, r.state, r.host,
                         ready_since=None if r.action == "keep" else planned_at)
                 for r in result.replicas if r.state in ("ready", "sleeping"))


ONE = [Gpu("a/0", "a", 40 * GiB)]


# --- scaling ---------------------------------------------------------------------------------------------


def test_a_request_waiting_for_a_deployment_scaled_to_zero_asks_for_one_replica():
    decision = decide(web(), now=NOW, settings=Settings())
    assert (decision.current, decision.target) == (0, 1)
    assert decision.reason == "3 requests are waiting: 0 -> 1 replica"
    assert decide(web(demand=0), now=NOW, settings=Settings()).target == 0


def test_demand_never_raises_a_deployment_above_its_maximum_of_zero():
    result = run(ONE, [web(max_replicas=0)])
    assert [r for r in result.replicas if r.deployment == "web"] == []
    assert outcome(result, "web").status == "refused" and "max_replicas is 0" in outcome(result, "web").reason


# --- placement -------------------------------------------------------------------------------------------


def test_demand_wakes_a_sleeping_replica_in_place():
    result = run(ONE, [web()], [Replica("web", 0, (), 0, "sleeping", "a")], ram=64 * GiB)
    woken = by_key(result)[("web", 0)]
    assert (woken.action, woken.state, woken.gpus) == ("wake", "ready", ("a/0",))
    assert woken.reason.startswith("wakes from a RAM for 3 waiting requests; ")
    assert outcome(result, "web") == DemandOutcome("web", "served", "woken from a RAM onto a/0 for 3 waiting requests")


def test_demand_places_a_never_placed_replica_of_a_min_zero_deployment():
    result = run(ONE, [web(demand=1)])
    placed = by_key(result)[("web", 0)]
    assert (placed.action, placed.gpus) == ("place", ("a/0",))
    assert placed.reason.startswith("placed for 1 waiting request: ")
    assert outcome(result, "web") == DemandOutcome("web", "served", "placed on a/0 for 1 waiting request")


def test_a_deployment_with_a_ready_replica_is_served_where_it_is():
    result = run(ONE, [web(replicas=1)], [Replica("web", 0, ("a/0",), 20 * GiB, last_request_at=NOW)])
    assert by_key(result)[("web", 0)].action == "keep"
    assert outcome(result, "web") == DemandOutcome("web", "served", "ready on a/0")


def test_demand_outranks_a_busier_extra_of_its_tier_and_is_not_swapped_out_in_the_same_pass():
    # Without demand the busier extra would take the one free slot; the waiting requests go first, and the
    # extra's temporal swap may not take the room back from the replica placed for them.
    busy = above_min("busy", traffic_rps=50.0)
    held = Deployment("held", 20 * GiB, replicas=1, min_replicas=1)
    result = run(ONE, [web(), busy, held], [Replica("held", 0, ("a/0",), 20 * GiB)])
    out = by_key(result)
    assert out[("web", 0)].state == "ready" and out[("busy", 0)].state == "stopped"
    without = by_key(run(ONE, [web(demand=0, replicas=1), busy, held], [Replica("held", 0, ("a/0",), 20 * GiB)]))
    assert without[("busy", 0)].state == "ready" and without[("web", 0)].state == "stopped"


# --- eviction for demand ---------------------------------------------------------------------------------


def test_demand_sleeps_the_least_recently_used_idle_replica_of_its_tier_on_one_gpu():
    replicas = [Replica("recent", 0, ("a/0",), 20 * GiB, last_request_at=NOW - 10),
                Replica("stale", 0, ("a/0",), 20 * GiB, last_request_at=NOW - 100)]
    result = run(ONE, [web(), above_min("recent"), above_min("stale")], replicas, ram=64 * GiB)
    out = by_key(result)
    victim = out[("stale", 0)]
    assert (victim.action, victim.state, victim.host, victim.preempted_by) == ("sleep", "sleeping", "a", "web#0")
    assert victim.reason == ("put to sleep for web#0 (standard, 3 requests waiting): idle for 100 s; "
                             "drained, then sleeping in a RAM (20.00 GiB)")
    assert out[("recent", 0)].action == "keep"
    assert out[("web", 0)].gpus == ("a/0",) and "took the room of stale#0 (idle)" in out[("web", 0)].reason
    assert outcome(result, "web").status == "served"


def test_demand_sleeps_the_least_recently_used_idle_replica_across_gpus_never_used_first():
    gpus = [Gpu("a/0", "a", 20 * GiB), Gpu("a/1", "a", 20 * GiB)]
    replicas = [Replica("used", 0, ("a/0",), 20 * GiB, last_request_at=NOW - 500),
                Replica("unused", 0, ("a/1",), 20 * GiB)]
    result = run(gpus, [web(), above_min("used"), above_min("unused")], replicas, ram=64 * GiB)
    out = by_key(result)
    assert out[("unused", 0)].action == "sleep" and out[("used", 0)].action == "keep"
    assert out[("unused", 0)].reason.startswith("put to sleep for web#0 (standard, 3 requests waiting): never used")
    assert out[("web", 0)].gpus == ("a/1",)


def test_a_busy_occupant_of_the_same_tier_makes_demand_wait_and_nothing_is_evicted():
    replicas = [Replica("std", 0, ("a/0",), 40 * GiB, last_request_at=NOW - 0.4)]
    result = run(ONE, [web(), above_min("std", 40 * GiB)], replicas, ram=64 * GiB)
    out = by_key(result)
    assert out[("std", 0)].action == "keep"
    assert out[("web", 0)].state == "stopped"
    assert outcome(result, "web") == DemandOutcome(
        "web", "waiting", "waiting for std#0 (standard) to go idle: busy 0.4 s ago (grace 2 s)")
    assert out[("web", 0)].reason == "3 requests waiting: " + outcome(result, "web").reason
    # Past the grace period the same occupant is put to sleep.
    later = run(ONE, [web(), above_min("std", 40 * GiB)], replicas, ram=64 * GiB, now=NOW + 5)
    assert by_key(later)[("std", 0)].action == "sleep" and outcome(later, "web").status == "served"


def test_an_occupant_within_its_minimum_residency_makes_demand_wait():
    replicas = [Replica("std", 0, ("a/0",), 40 * GiB, last_request_at=NOW - 100, ready_since=NOW - 1.2)]
    result = run(ONE, [web(), above_min("std", 40 * GiB)], replicas, ram=64 * GiB)
    assert by_key(result)[("std", 0)].action == "keep"
    assert outcome(result, "web") == DemandOutcome(
        "web", "waiting", "waiting for std#0 (standard) to finish its 5 s minimum residency (placed or woken "
                          "1.2 s ago)")
    # The residency also holds against a lower tier, and ends after min_residency_s.
    crawl = above_min("crawl", 40 * GiB, "batch")
    held = run(ONE, [web(), crawl], [replace(replicas[0], deployment="crawl")], min_residency_s=5)
    assert outcome(held, "web").status == "waiting" and by_key(held)[("crawl", 0)].action == "keep"
    free = run(ONE, [web(), crawl], [replace(replicas[0], deployment="crawl")], min_residency_s=1)
    assert outcome(free, "web").status == "served" and by_key(free)[("crawl", 0)].action == "preempt"


def test_a_busy_occupant_of_a_lower_tier_is_preempted_for_demand():
    replicas = [Replica("crawl", 0, ("a/0",), 40 * GiB, last_request_at=NOW - 0.1)]
    result = run(ONE, [web(), above_min("crawl", 40 * GiB, "batch")], replicas)
    out = by_key(result)
    assert (out[("crawl", 0)].action, out[("crawl", 0)].preempted_by) == ("preempt", "web#0")
    assert out[("crawl", 0)].reason == ("preempted by web#0 (standard, 3 requests waiting); stopped: a reports no "
                                        "host RAM for sleeping replicas")
    assert out[("web", 0)].state == "ready"


def test_a_lower_tier_goes_before_an_idle_replica_of_the_same_tier():
    gpus = [Gpu("a/0", "a", 20 * GiB), Gpu("a/1", "a", 20 * GiB)]
    replicas = [Replica("std", 0, ("a/0",), 20 * GiB, last_request_at=NOW - 900),
                Replica("crawl", 0, ("a/1",), 20 * GiB, last_request_at=NOW)]
    result = run(gpus, [web(), above_min("std"), above_min("crawl", priority="batch")], replicas)
    out = by_key(result)
    assert out[("crawl", 0)].action == "preempt" and out[("std", 0)].action == "keep"


def test_a_higher_tier_occupant_is_never_displaced_and_demand_is_refused_naming_it():
    replicas = [Replica("crit", 0, ("a/0",), 40 * GiB)]  # never used, long resident: idle
    result = run(ONE, [web(), above_min("crit", 40 * GiB, "critical")], replicas, ram=64 * GiB)
    assert by_key(result)[("crit", 0)].action == "keep"
    assert outcome(result, "web") == DemandOutcome(
        "web", "refused", "needs 20.00 GiB; every replica it could displace is of a higher tier or at its "
                          "min_replicas: a/0 holds crit#0 (critical)")


def test_a_refusal_names_an_occupant_of_another_team_only_as_a_replica_of_another_team():
    gpus = [Gpu("a/0", "a", 40 * GiB)]
    crit = above_min("crit", priority="critical", team=2)
    mine = above_min("ours", priority="critical", team=1)
    replicas = [Replica("crit", 0, ("a/0",), 20 * GiB), Replica("ours", 0, ("a/0",), 20 * GiB)]
    result = run(gpus, [web(team=1), crit, mine], replicas, ram=64 * GiB)
    assert outcome(result, "web").reason.endswith("a/0 holds a replica of another team (critical), ours#0 (critical)")


def test_a_same_tier_occupant_at_its_minimum_is_never_displaced_and_demand_is_refused_naming_it():
    pinned = Deployment("std", 40 * GiB, replicas=1, min_replicas=1)
    result = run(ONE, [web(), pinned], [Replica("std", 0, ("a/0",), 40 * GiB)], ram=64 * GiB)
    assert by_key(result)[("std", 0)].action == "keep"
    assert outcome(result, "web").status == "refused"
    assert outcome(result, "web").reason.endswith("a/0 holds std#0 (standard, at its minimum)")


def test_a_critical_replica_is_never_put_to_sleep_for_a_standard_demand():
    # The priority inversion: the idle critical replica is not a victim even while the standard one is busy.
    gpus = [Gpu("a/0", "a", 20 * GiB), Gpu("b/0", "b", 20 * GiB)]
    replicas = [Replica("crit", 0, ("a/0",), 20 * GiB), Replica("std", 0, ("b/0",), 20 * GiB,
                                                                last_request_at=NOW - 1)]
    result = run(gpus, [web(), above_min("crit", priority="critical"), above_min("std")], replicas, ram=64 * GiB)
    out = by_key(result)
    assert out[("crit", 0)].action == "keep" and out[("std", 0)].action == "keep"
    assert outcome(result, "web").status == "waiting"
    assert "std#0 (standard) to go idle" in outcome(result, "web").reason


def test_a_model_larger_than_any_gpu_is_refused_at_once():
    gpus = [Gpu("a/0", "a", 160 * MiB), Gpu("a/1", "a", 200 * MiB, used_bytes=100 * MiB)]
    result = run(gpus, [web(bytes=190 * MiB)])
    assert outcome(result, "web") == DemandOutcome(
        "web", "refused", "needs 190.0 MiB; no GPU can ever hold it: the largest is 160.0 MiB (a/0)")


def test_a_gang_no_host_can_hold_is_refused_at_once():
    gpus = [Gpu("a/0", "a", 40 * GiB), Gpu("b/0", "b", 40 * GiB)]
    result = run(gpus, [web(gpus_per_replica=2)])
    assert outcome(result, "web").status == "refused"
    assert "no host can ever hold it: the most such GPUs on one host is 1" in outcome(result, "web").reason


def test_only_deployments_with_requests_waiting_get_an_outcome():
    result = run(ONE, [web(), above_min("other", 10 * GiB)])
    assert [d.deployment for d in result.demands] == ["web"]
    assert run(ONE, [above_min("other", 10 * GiB)]).demands == ()


# --- scale to zero ---------------------------------------------------------------------------------------


IDLE = above_min("web", 10 * GiB, idle_timeout_s=300, active_at=NOW - 312)


def test_a_min_zero_deployment_idle_past_its_timeout_sleeps_then_a_request_wakes_it():
    first = run(ONE, [IDLE], [Replica("web", 0, ("a/0",), 10 * GiB)], ram=64 * GiB)
    slept = by_key(first)[("web", 0)]
    assert (slept.action, slept.state, slept.host, slept.from_gpus) == ("sleep", "sleeping", "a", ("a/0",))
    assert slept.reason == ("idle for 312 s (idle_timeout_s 300): scaled to zero; drained, then sleeping in a RAM "
                            "(10.00 GiB)")
    assert [s.target for s in first.scale] == [1]  # the replica row stays: the next request brings it back
    second = run(ONE, [IDLE], next_pass(first), ram=64 * GiB)
    stays = by_key(second)[("web", 0)]
    assert (stays.action, stays.state) == ("keep", "sleeping")
    assert stays.reason == ("stays asleep in a RAM: idle for 312 s (idle_timeout_s 300): scaled to zero; "
                            "a request wakes it")
    wanted = replace(IDLE, demand=1, active_at=NOW + 1)
    third = run(ONE, [wanted], next_pass(second), ram=64 * GiB, now=NOW + 1)
    assert by_key(third)[("web", 0)].action == "wake" and outcome(third, "web").status == "served"


def test_an_idle_deployment_stops_without_host_ram_and_stays_unplaced_as_idle():
    first = run(ONE, [IDLE], [Replica("web", 0, ("a/0",), 10 * GiB)])
    stopped = by_key(first)[("web", 0)]
    assert (stopped.action, stopped.state) == ("stop", "stopped")
    assert stopped.reason.startswith("idle for 312 s (idle_timeout_s 300): scaled to zero; stopped: ")
    second = run(ONE, [IDLE], next_pass(first))
    unplaced = by_key(second)[("web", 0)]
    assert (unplaced.action, unplaced.state) == ("refuse", "stopped")
    assert unplaced.reason == "idle for 312 s (idle_timeout_s 300): scaled to zero; a request places it"


def test_a_deployment_is_not_idle_within_its_timeout_nor_with_a_minimum_nor_with_demand():
    replicas = [Replica("web", 0, ("a/0",), 10 * GiB)]
    for dep in (replace(IDLE, active_at=NOW - 299), replace(IDLE, min_replicas=1), replace(IDLE, demand=1),
                replace(IDLE, active_at=None), replace(IDLE, idle_timeout_s=None)):
        assert by_key(run(ONE, [dep], replicas, ram=64 * GiB))[("web", 0)].action == "keep", dep


# --- stability -------------------------------------------------------------------------------------------


def test_replanning_a_served_result_without_demand_keeps_everything():
    deployments = [web(), above_min("recent"), above_min("stale")]
    replicas = [Replica("recent", 0, ("a/0",), 20 * GiB, last_request_at=NOW - 10),
                Replica("stale", 0, ("a/0",), 20 * GiB, last_request_at=NOW - 100)]
    served = run(ONE, deployments, replicas, ram=64 * GiB)
    quiet = [replace(deployments[0], demand=0, replicas=1)] + deployments[1:]
    again = run(ONE, quiet, next_pass(served), ram=64 * GiB)
    assert again.moves == () and again.demands == ()
    out = by_key(again)
    assert (out[("web", 0)].action, out[("web", 0)].gpus) == ("keep", ("a/0",))
    assert (out[("stale", 0)].action, out[("stale", 0)].state) == ("keep", "sleeping")


def test_a_replica_woken_for_demand_is_not_swapped_back_within_its_residency():
    # The sleeper has far more tier-weighted traffic, so a temporal swap would take the room back: not within
    # the 5 s residency of the replica placed for the demand, and only after it.
    deployments = [web(), above_min("stale", traffic_rps=50.0)]
    replicas = [Replica("stale", 0, ("a/0",), 40 * GiB, last_request_at=NOW - 100)]
    served = run(ONE, [web(bytes=40 * GiB), deployments[1]], replicas, ram=64 * GiB)
    assert by_key(served)[("stale", 0)].action == "sleep"
    quiet = [web(bytes=40 * GiB, demand=0, replicas=1), deployments[1]]
    soon = run(ONE, quiet, next_pass(served), ram=64 * GiB, now=NOW + 1)
    assert by_key(soon)[("web", 0)].action == "keep" and by_key(soon)[("stale", 0)].state == "sleeping"
    later = run(ONE, quiet, next_pass(served), ram=64 * GiB, now=NOW + 10)
    assert by_key(later)[("stale", 0)].action == "wake" and by_key(later)[("web", 0)].action == "sleep"


def test_replanning_a_waiting_demand_with_the_same_inputs_changes_nothing():
    replicas = [Replica("std", 0, ("a/0",), 40 * GiB, last_request_at=NOW - 0.4)]
    deployments = [web(), above_min("std", 40 * GiB)]
    first = run(ONE, deployments, replicas)
    second = run(ONE, deployments, [replace(r, last_request_at=NOW - 0.4) for r in next_pass(first)])
    assert second.replicas == first.replicas and second.demands == first.demands


def test_the_slo_loop_never_takes_the_last_replica_of_a_scale_to_zero_deployment():
    quiet = Deployment("rare", GiB, replicas=1, min_replicas=0, max_replicas=3, status_since=0.0)
    decision = decide(quiet, now=10_000.0, settings=Settings())
    assert decision.target == 1 and "idle_timeout_s" in decision.reason
    busier = Deployment("rare", GiB, replicas=2, min_replicas=0, max_replicas=3, status_since=0.0)
    assert decide(busier, now=10_000.0, settings=Settings()).target == 1  # extras still go after the quiet window


def test_when_two_deployments_wait_for_one_gpu_the_longest_waiting_goes_first():
    holder = [Replica("holder", 0, ("a/0",), 40 * GiB, last_request_at=NOW - 100)]
    for early, late in (("zeta", "alpha"), ("alpha", "zeta")):  # not by name: by how long they waited
        waiting = [above_min(early, 40 * GiB, replicas=0, demand=1, demand_since=NOW - 30),
                   above_min(late, 40 * GiB, replicas=0, demand=1, demand_since=NOW - 2)]
        deployments = sorted([above_min("holder", 40 * GiB), *waiting], key=lambda d: d.name)  # as the console
        result = run(ONE, deployments, holder, ram=64 * GiB)
        assert outcome(result, early).status == "served", result.demands
        assert outcome(result, late).status != "served"


def test_a_replica_whose_requests_are_waiting_is_never_swapped_out_for_traffic_elsewhere():
    busy = above_min("busy", 40 * GiB, demand=2)  # requests waiting for it: what it is on the GPU for
    hot = above_min("hot", 40 * GiB, traffic_rps=100.0)
    replicas = [Replica("busy", 0, ("a/0",), 40 * GiB), Replica("hot", 0, (), 0, "sleeping", "a")]
    out = by_key(run(ONE, [busy, hot], replicas, ram=64 * GiB))
    assert out[("busy", 0)].action == "keep" and out[("hot", 0)].state == "sleeping"


# --- outlooks: what a request would get, with none waiting ----------------------------------------------------


def test_a_deployment_asleep_behind_a_higher_tier_reads_blocked_with_the_reason_a_request_would_get():
    # web's replica sleeps in host RAM, its room held by a critical replica: a request would be refused, so no page
    # may say that a request wakes it.
    replicas = [Replica("crit", 0, ("a/0",), 40 * GiB), Replica("web", 0, (), 20 * GiB, "sleeping", "a")]
    result = run(ONE, [web(demand=0, replicas=1), above_min("crit", 40 * GiB, "critical")], replicas, ram=64 * GiB)
    assert by_key(result)[("web", 0)].state == "sleeping"
    assert result.demands == ()
    assert result.outlooks == (DemandOutcome(
        "web", "blocked", "needs 20.00 GiB; every replica it could displace is of a higher tier or at its "
                          "min_replicas: a/0 holds crit#0 (critical)"),)


def test_a_deployment_a_request_would_wake_has_no_outlook():
    replicas = [Replica("std", 0, ("a/0",), 40 * GiB), Replica("web", 0, (), 20 * GiB, "sleeping", "a")]
    result = run(ONE, [web(demand=0, replicas=1), above_min("std", 40 * GiB)], replicas, ram=64 * GiB)
    assert result.outlooks == ()  # std#0 is idle and above its minimum: a request would put it to sleep


def test_a_deployment_no_gpu_can_hold_reads_blocked_before_any_request():
    result = run(ONE, [Deployment("huge", 80 * GiB)])
    assert [(o.deployment, o.status) for o in result.outlooks] == [("huge", "blocked")]
    assert "no GPU can ever hold it" in result.outlooks[0].reason
