"""next_change: until the moment it names, planning the same input again decides the same (hypothesis)."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.scheduler import STRATEGIES, TIERS, Deployment, Gpu, Host, PlanInput, Replica, Settings, plan
from console.scheduler.horizon import next_change

GiB = 1024**3
RULES = Settings(search_budget_s=60, search_iterations=100, quiet_window_s=30, cooldown_s=20, idle_grace_s=2,
                 min_residency_s=5)
# Moments around now (100) that the time rules compare with: some long past, some just past, some ahead.
MOMENTS = st.sampled_from([None, 0.0, 70.0, 85.0, 96.0, 99.0, 100.0])


@st.composite
def timed_inputs(draw):
    # A small fleet, so that requests waiting for one deployment must take the room of another.
    gpus = tuple(Gpu(f"h{h}/{i}", f"h{h}", 24 * GiB) for h in range(draw(st.integers(1, 2)))
                 for i in range(draw(st.integers(1, 2))))
    deployments = []
    for n in range(draw(st.integers(1, 5))):
        low = draw(st.integers(0, 2))
        high = low + draw(st.integers(0, 2))
        slo = draw(st.sampled_from([None, 200.0]))
        deployments.append(Deployment(
            f"d{n}", draw(st.integers(4, 20)) * GiB, replicas=draw(st.integers(low, high)), min_replicas=low,
            max_replicas=high, priority=draw(st.sampled_from(TIERS)), slo_latency_ms=slo,
            observed_latency_ms=draw(st.sampled_from([100.0, 400.0])) if slo else None,
            traffic_rps=draw(st.sampled_from([0.0, 5.0])), demand=draw(st.sampled_from([0, 2])),
            idle_timeout_s=draw(st.sampled_from([None, 10.0])), active_at=draw(MOMENTS),
            last_scale_at=draw(MOMENTS), status_since=draw(MOMENTS)))
    request = PlanInput(gpus, tuple(deployments), hosts=tuple(Host(f"h{h}", 100 * GiB) for h in range(3)),
                        strategy=draw(st.sampled_from(STRATEGIES)), now=100.0, settings=RULES)
    # The replicas as a first plan left them before any request waited, each placed, woken and last used at some
    # moment around now: requests now waiting may have to take their room.
    first = plan(replace(request, deployments=tuple(replace(d, demand=0) for d in deployments)))
    replicas = tuple(Replica(r.deployment, r.index, r.gpus, r.reserved_bytes, r.state, r.host,
                             last_request_at=draw(MOMENTS), ready_since=draw(MOMENTS))
                     for r in first.replicas if r.state in ("ready", "sleeping"))
    return replace(request, replicas=replicas)


def decisions(request: PlanInput) -> list[tuple]:
    return sorted((r.deployment, r.index, r.gpus, r.state, r.action) for r in plan(request).replicas)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timed_inputs())
def test_planning_again_before_the_next_change_decides_the_same(request):
    # Walk the clock from one named moment to the next: within each stretch the plan must not change.
    at = request
    for _ in range(12):
        until = next_change(at)
        just_before = until - 1e-6 if until is not None else at.now + 1e6  # the furthest the same plan holds
        assert decisions(replace(request, now=just_before)) == decisions(at), (at.now, until)
        if until is None:
            break
        at = replace(request, now=until)


def test_it_names_the_earliest_rule_still_ahead():
    dep = Deployment("a", GiB, idle_timeout_s=60, active_at=50.0, last_scale_at=90.0, status_since=0.0)
    replica = Replica("a", 0, ("h/0",), GiB, ready_since=97.0, last_request_at=99.5)
    request = PlanInput((Gpu("h/0", "h", 24 * GiB),), (dep,), (replica,), now=100.0, settings=RULES)
    # idle at 110, cooldown over at 110, quiet window over at 30 (past), residency over at 102, idle grace at 101.5
    assert next_change(request) == 101.5
    assert next_change(replace(request, replicas=())) == 110.0
    assert next_change(replace(request, now=200.0)) is None  # every rule has turned


def test_a_deployment_that_goes_idle_is_replanned_at_that_moment():
    dep = Deployment("a", GiB, replicas=1, min_replicas=0, max_replicas=1, idle_timeout_s=60, active_at=50.0)
    replica = Replica("a", 0, ("h/0",), GiB)
    request = PlanInput((Gpu("h/0", "h", 24 * GiB),), (dep,), (replica,), now=100.0, settings=RULES)
    assert next_change(request) == 110.0
    assert [r.state for r in plan(replace(request, now=109.9)).replicas] == ["ready"]
    assert [r.state for r in plan(replace(request, now=110.0)).replicas] != ["ready"]  # idle: off its GPU


def waiting_for_room(**a_replica) -> PlanInput:
    """One GPU held by a#0; requests wait for b, which fits only in a's place."""
    a = Deployment("a", 20 * GiB, replicas=1, min_replicas=0, max_replicas=1)
    b = Deployment("b", 20 * GiB, replicas=1, min_replicas=0, max_replicas=1, demand=2)
    return PlanInput((Gpu("h/0", "h", 24 * GiB),), (a, b), (Replica("a", 0, ("h/0",), 20 * GiB, **a_replica),),
                     hosts=(Host("h", 100 * GiB),), now=100.0, settings=RULES)


def test_requests_waiting_for_a_replicas_residency_are_replanned_when_it_ends():
    request = waiting_for_room(ready_since=98.0)
    assert next_change(request) == 103.0
    assert "minimum residency" in {r.deployment: r for r in plan(replace(request, now=102.9)).replicas}["b"].reason
    assert decisions(replace(request, now=103.0)) != decisions(request)  # a sleeps, b takes its place


def test_requests_waiting_for_a_busy_replica_are_replanned_when_it_goes_idle():
    request = waiting_for_room(last_request_at=99.5)
    assert next_change(request) == 101.5
    assert "to go idle" in {r.deployment: r for r in plan(replace(request, now=101.4)).replicas}["b"].reason
    assert decisions(replace(request, now=101.5)) != decisions(request)
