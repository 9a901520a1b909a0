"""A backlog at the gateway: requests backed up for a deployment that has ready replicas ask for one more replica,
which wakes or is placed under demand's tier rules, so a higher tier's backlog puts a lower tier's model to sleep."""

from dataclasses import replace

from console.scheduler import DemandOutcome, Deployment, Gpu, Host, PlanInput, Replica, Settings, plan
from console.scheduler.scaling import decide

GiB = 1024**3
NOW = 1000.0
ONE = [Gpu("a/0", "a", 40 * GiB)]


def vital(**changes) -> Deployment:
    """A critical deployment with one replica ready (its agent says so) and 12 requests backed up for it."""
    return replace(Deployment("vital", 20 * GiB, replicas=1, min_replicas=1, max_replicas=2, priority="critical",
                              demand=12, ready_replicas=1), **changes)


def crawl(**changes) -> Deployment:
    """A batch deployment above its minimum."""
    return replace(Deployment("crawl", 20 * GiB, replicas=1, min_replicas=0, max_replicas=1, priority="batch"),
                   **changes)


READY = Replica("vital", 0, ("a/0",), 20 * GiB, last_request_at=NOW)
CRAWLING = Replica("crawl", 0, ("a/0",), 20 * GiB, last_request_at=NOW - 0.1)  # busy, long resident


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
    """The replicas `result` leaves, as the console records them (see test_demand.next_pass)."""
    return tuple(Replica(r.deployment, r.index, r.gpus, r.reserved_bytes, r.state, r.host,
                         ready_since=None if r.action == "keep" else planned_at)
                 for r in result.replicas if r.state in ("ready", "sleeping"))


# --- scaling ---------------------------------------------------------------------------------------------


def test_a_backlog_behind_a_ready_replica_asks_for_one_more():
    decision = decide(vital(), now=NOW, settings=Settings())
    assert (decision.current, decision.target) == (1, 2)
    assert decision.reason == "12 requests backed up at the gateway: 1 -> 2 replicas"


def test_a_backlog_asks_for_one_more_than_are_ready_never_more_nor_past_the_maximum():
    # One on its way already (2 wanted, 1 ready): it waits for that one rather than asking for a third.
    on_its_way = decide(vital(replicas=2, max_replicas=4), now=NOW, settings=Settings())
    assert on_its_way.target == 2
    assert on_its_way.reason == "12 requests backed up at the gateway: stays at 2 replicas (1 ready, 1 on its way)"
    more = decide(vital(replicas=2, max_replicas=4, ready_replicas=2), now=NOW, settings=Settings())
    assert (more.target, more.reason) == (3, "12 requests backed up at the gateway: 2 -> 3 replicas")
    full = decide(vital(replicas=2, ready_replicas=2), now=NOW, settings=Settings())
    assert full.target == 2 and full.reason.endswith(
        "; 12 requests backed up at the gateway, but it is at its maximum of 2 replicas")


def test_a_backlog_is_not_held_back_by_the_cooldown():
    decision = decide(vital(last_scale_at=NOW - 10), now=NOW, settings=Settings(cooldown_s=120))
    assert decision.target == 2


def test_a_backlog_never_scales_down_after_a_quiet_window():
    quiet = vital(replicas=2, max_replicas=3, min_replicas=0, status_since=0.0, slo_latency_ms=100.0,
                  observed_latency_ms=10.0)
    assert decide(replace(quiet, demand=0), now=NOW, settings=Settings()).target == 1  # without it: one goes
    assert decide(quiet, now=NOW, settings=Settings()).target == 2


def test_without_a_backlog_or_with_none_ready_the_count_is_as_before():
    assert decide(vital(demand=0), now=NOW, settings=Settings()).target == 1
    # None ready: the requests wait for a first replica, which the deployment's minimum already asks for.
    none_ready = decide(vital(ready_replicas=0), now=NOW, settings=Settings())
    assert none_ready.target == 1 and "backed up" not in none_ready.reason


# --- placement: a higher tier's backlog puts a lower tier to sleep ---------------------------------------


def test_a_critical_backlog_puts_a_batch_model_to_sleep_for_a_second_replica():
    result = run(ONE, [vital(), crawl()], [READY, CRAWLING], ram=64 * GiB)
    out = by_key(result)
    victim = out[("crawl", 0)]
    assert (victim.action, victim.state, victim.host, victim.preempted_by) == ("preempt", "sleeping", "a", "vital#1")
    assert victim.reason == ("preempted by vital#1 (critical, 12 requests backed up at the gateway); drained, then "
                             "sleeping in a RAM (20.00 GiB)")
    assert out[("vital", 0)].action == "keep"
    added = out[("vital", 1)]
    assert (added.action, added.state, added.gpus) == ("place", "ready", ("a/0",))
    assert added.reason.startswith("placed for 12 requests backed up at the gateway: ")
    assert "took the room of crawl#0 (lower tier)" in added.reason
    assert [(s.deployment, s.target) for s in result.scale] == [("crawl", 1), ("vital", 2)]
    assert outcome(result, "vital") == DemandOutcome(
        "vital", "served", "backed up behind 1 ready replica: adding vital#1, placed on a/0")


def test_the_replica_added_for_a_backlog_is_a_sleeping_one_first_woken_in_place():
    asleep = Replica("vital", 2, (), 0, "sleeping", "a")
    result = run(ONE, [vital(), crawl()], [READY, asleep, CRAWLING], ram=64 * GiB)
    out = by_key(result)
    assert ("vital", 1) not in out  # no new replica: the sleeping one wakes
    woken = out[("vital", 2)]
    assert (woken.action, woken.state, woken.gpus) == ("wake", "ready", ("a/0",))
    assert woken.reason.startswith("wakes from a RAM for 12 requests backed up at the gateway; ")
    assert out[("crawl", 0)].action == "preempt"
    assert outcome(result, "vital").reason == ("backed up behind 1 ready replica: adding vital#2, woken from a RAM "
                                               "onto a/0")


def test_a_backlog_sleeps_only_an_idle_replica_of_its_own_tier_and_never_a_higher_one():
    busy = crawl(priority="critical")
    result = run(ONE, [vital(), busy], [READY, replace(CRAWLING, last_request_at=NOW - 0.4)], ram=64 * GiB)
    assert by_key(result)[("crawl", 0)].action == "keep" and by_key(result)[("vital", 1)].state == "stopped"
    assert outcome(result, "vital") == DemandOutcome(
        "vital", "served", "backed up behind 1 ready replica; a replica is added once there is room: waiting for "
                           "crawl#0 (critical) to go idle: busy 0.4 s ago (grace 2 s)")
    assert by_key(result)[("vital", 1)].reason == ("12 requests backed up at the gateway: waiting for crawl#0 "
                                                   "(critical) to go idle: busy 0.4 s ago (grace 2 s)")
    idle = run(ONE, [vital(), busy], [READY, replace(CRAWLING, last_request_at=NOW - 100)], ram=64 * GiB)
    assert by_key(idle)[("crawl", 0)].action == "sleep" and by_key(idle)[("vital", 1)].state == "ready"
    # A higher tier is never displaced: the backlog is told why no replica can be added.
    refused = run(ONE, [vital(priority="standard"), crawl(priority="critical")], [READY, CRAWLING], ram=64 * GiB)
    assert by_key(refused)[("crawl", 0)].action == "keep"
    assert outcome(refused, "vital") == DemandOutcome(
        "vital", "served", "backed up behind 1 ready replica, but no replica can be added: needs 20.00 GiB; every "
                           "replica it could displace is of a higher tier or at its min_replicas: a/0 holds "
                           "vital#0 (its own), crawl#0 (critical)")


def test_a_backlog_at_its_maximum_changes_nothing_and_says_so():
    at_max = vital(max_replicas=1)
    result = run(ONE, [at_max, crawl()], [READY, CRAWLING], ram=64 * GiB)
    out = by_key(result)
    assert out[("crawl", 0)].action == "keep" and out[("vital", 0)].action == "keep" and ("vital", 1) not in out
    assert outcome(result, "vital") == DemandOutcome(
        "vital", "served", "backed up behind 1 ready replica, but it is at its maximum of 1 replica")


def test_without_a_backlog_nothing_is_displaced():
    result = run(ONE, [vital(demand=0), crawl()], [READY, CRAWLING], ram=64 * GiB)
    assert by_key(result)[("crawl", 0)].action == "keep" and ("vital", 1) not in by_key(result)
    assert result.demands == ()


def test_the_next_pass_waits_for_the_added_replica_and_moves_nothing():
    first = run(ONE, [vital(), crawl()], [READY, CRAWLING], ram=64 * GiB)
    # The added replica is loading (not ready at the gateway yet) and the requests are still backed up.
    again = run(ONE, [vital(replicas=2), crawl()], next_pass(first), ram=64 * GiB, now=NOW + 1)
    out = by_key(again)
    assert again.moves == () and {r.action for r in again.replicas} == {"keep"}
    assert out[("crawl", 0)].state == "sleeping"
    assert [s.target for s in again.scale if s.deployment == "vital"] == [2]
    assert outcome(again, "vital") == DemandOutcome(
        "vital", "served", "backed up behind 1 ready replica: 1 more replica is on its way")
