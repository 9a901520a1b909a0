"""Properties that hold for any fleet and any deployments (hypothesis): capacity, gangs, tiers, stability, spread,
taints."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.scheduler import STRATEGIES, TIERS, Deployment, Gpu, Host, PlanInput, Replica, Settings, plan
from console.scheduler.types import TIER_RANK

GiB = 1024**3
HALF = GiB // 2
FAST = Settings(search_budget_s=60, search_iterations=150)  # deterministic and quick


@st.composite
def fleets(draw):
    gpus = []
    for h in range(draw(st.integers(1, 4))):
        for i in range(draw(st.integers(1, 4))):
            total = draw(st.sampled_from([16, 24, 40, 80])) * GiB
            used = draw(st.integers(0, 16)) * HALF
            labels = {"gpu": draw(st.sampled_from(["a100", "l4"])), "zone": f"z{h % 2}"}
            taints = draw(st.sampled_from([{}, {}, {}, {"pool": "ml"}, {"pool": "batch"}]))
            gpus.append(Gpu(f"h{h}/{i}", f"h{h}", total, used, labels, taints))
    return tuple(gpus)


@st.composite
def deployments(draw):
    found = []
    for n in range(draw(st.integers(1, 7))):
        low = draw(st.integers(0, 3))
        high = low + draw(st.integers(0, 2))
        slo = draw(st.sampled_from([None, 200.0]))
        found.append(Deployment(
            name=f"d{n}",
            bytes=draw(st.integers(1, 100)) * HALF,
            replicas=draw(st.integers(low, high)),
            min_replicas=low,
            max_replicas=high,
            gpus_per_replica=draw(st.sampled_from([1, 1, 1, 2, 3])),
            priority=draw(st.sampled_from(TIERS)),
            selector=draw(st.sampled_from([{}, {}, {"gpu": "a100"}])),
            tolerations=draw(st.sampled_from([{}, {}, {"pool": "ml"}, {"pool": "*"}])),
            spread=draw(st.sampled_from(["preferred", "preferred", "required", "none"])),
            slo_latency_ms=slo,
            observed_latency_ms=draw(st.sampled_from([100.0, 400.0])) if slo else None,
            latency_critical=draw(st.booleans()),
            profile=draw(st.sampled_from([None, "compute", "memory", "io"])),
            traffic_rps=draw(st.sampled_from([0.0, 1.0, 50.0])),
            demand=draw(st.sampled_from([0, 0, 0, 2])),  # requests waiting at the gateway
            idle_timeout_s=draw(st.sampled_from([None, None, 60.0])),  # idle at now 0 when active_at is -100
            active_at=draw(st.sampled_from([None, -100.0, 0.0])),
        ))
    return tuple(found)


@st.composite
def inputs(draw):
    gpus = draw(fleets())
    hosts = tuple(Host(h, draw(st.sampled_from([None, 0, 40 * GiB]))) for h in sorted({g.host for g in gpus}))
    return PlanInput(gpus, draw(deployments()), hosts=hosts, strategy=draw(st.sampled_from(STRATEGIES)),
                     buffer_bytes=draw(st.integers(0, 2)) * HALF, settings=FAST)


def carry_over(request: PlanInput, result, planned_at: float | None = None) -> PlanInput:
    """The next pass's input: the same request with the replicas as this plan left them. Replicas it placed, woke
    or moved are ready since `planned_at` (the time of the pass that made `result`; default `request.now`), as
    the console records them; kept ones since long ago."""
    at = request.now if planned_at is None else planned_at
    current = tuple(
        Replica(r.deployment, r.index, r.gpus, r.reserved_bytes, r.state, r.host,
                ready_since=None if r.action == "keep" else at)
        for r in result.replicas if r.state in ("ready", "sleeping"))
    return replace(request, replicas=current)


def shaken(request: PlanInput, draw) -> PlanInput:
    """The same fleet 10 s later (past every residency) after traffic changed: some deployments now violate
    their SLO or want more replicas, some have requests waiting, some of them backed up behind ready replicas."""
    changed = []
    for d in request.deployments:
        if draw(st.booleans()):
            d = replace(d, violating=True, max_replicas=d.high + 2)
        if draw(st.booleans()):
            d = replace(d, demand=2, ready_replicas=draw(st.sampled_from([0, 1, 2])))
        changed.append(d)
    return replace(request, deployments=tuple(changed), now=request.now + 10)


RUN = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_within_capacity_and_gangs_on_one_host(request: PlanInput, result) -> None:
    reserved = {g.id: 0 for g in request.gpus}
    width = {d.name: d.gpus_per_replica for d in request.deployments}
    host = {g.id: g.host for g in request.gpus}
    for r in result.replicas:
        if r.state == "ready":
            assert len(r.gpus) == width[r.deployment]
            assert len({host[g] for g in r.gpus}) == 1, r
            for g in r.gpus:
                reserved[g] += r.reserved_bytes // len(r.gpus)
    for g in request.gpus:
        assert reserved[g.id] <= max(g.total_bytes - g.used_bytes - request.buffer_bytes, 0), g.id
    assert {b.gpu: b.reserved_bytes for b in result.ledger} == reserved


@RUN
@given(inputs(), st.data())
def test_no_gpu_is_ever_over_capacity_minus_buffer_and_gangs_share_a_host(request, data):
    first = plan(request)
    assert_within_capacity_and_gangs_on_one_host(request, first)
    shaken_request = shaken(request, data.draw)
    assert_within_capacity_and_gangs_on_one_host(shaken_request,
                                                 plan(carry_over(shaken_request, first, request.now)))


@RUN
@given(inputs(), st.data())
def test_a_higher_tier_is_never_preempted_for_a_lower_one(request, data):
    first = plan(request)
    second = plan(carry_over(shaken(request, data.draw), first, request.now))
    tiers = {d.name: TIER_RANK[d.priority] for d in request.deployments}
    for r in second.replicas:
        if r.preempted_by is not None:
            by = r.preempted_by.rsplit("#", 1)[0]
            assert tiers[by] <= tiers[r.deployment], (r.deployment, r.preempted_by)
            if r.action == "preempt":
                assert tiers[by] < tiers[r.deployment] or "minimum" in r.reason, r.reason


@RUN
@given(st.integers(1, 6), st.lists(st.sampled_from(["high", "standard", "batch"]), min_size=1, max_size=4),
       st.integers(1, 4), st.sampled_from(STRATEGIES))
def test_a_full_fleet_makes_room_for_a_higher_tier_only_from_lower_ones(gpus, filler_tiers, parts, strategy):
    # Every GPU is exactly filled by lower-tier replicas; a critical deployment then needs one GPU's worth
    # of room: it must get it, by preemption, and only from strictly lower tiers.
    fleet = tuple(Gpu(f"h{i}/0", f"h{i}", 80 * GiB) for i in range(gpus))
    fillers = tuple(Deployment(f"f{i}", 80 * GiB // parts, replicas=gpus * parts // len(filler_tiers) + 1,
                               min_replicas=0, priority=tier) for i, tier in enumerate(filler_tiers))
    full = plan(PlanInput(fleet, fillers, strategy=strategy, settings=FAST))
    request = replace(carry_over(PlanInput(fleet, fillers, strategy=strategy, settings=FAST), full),
                      deployments=(*fillers, Deployment("vital", 80 * GiB // parts, priority="critical")))
    result = plan(request)
    tiers = {d.name: TIER_RANK[d.priority] for d in request.deployments}
    assert [r.state for r in result.replicas if r.deployment == "vital"] == ["ready"]
    victims = [r for r in result.replicas if r.preempted_by is not None]
    if sum(r.state == "ready" for r in full.replicas) * (80 * GiB // parts) > (gpus - 1) * 80 * GiB:
        assert victims  # no GPU had room left: vital's place came from preemption
    assert all(tiers[r.deployment] > tiers["vital"] for r in victims)


@RUN
@given(inputs())
def test_a_replan_of_an_unchanged_input_moves_nothing(request):
    first = plan(request)
    second = plan(carry_over(request, first))
    assert second.moves == ()
    before = {(r.deployment, r.index): r.gpus for r in first.replicas if r.state == "ready"}
    after = {(r.deployment, r.index): r.gpus for r in second.replicas if r.state == "ready"}
    assert after == before
    assert {r.action for r in second.replicas if r.state == "ready"} <= {"keep"}


@RUN
@given(inputs(), st.data())
def test_a_replan_after_preemptions_and_sleeps_moves_nothing(request, data):
    shaken_request = shaken(request, data.draw)
    second = plan(carry_over(shaken_request, plan(request), request.now))
    third = plan(carry_over(shaken_request, second))
    assert third.moves == ()
    before = {(r.deployment, r.index): r.gpus for r in second.replicas if r.state == "ready"}
    assert {(r.deployment, r.index): r.gpus for r in third.replicas if r.state == "ready"} == before


@RUN
@given(inputs())
def test_no_plan_puts_two_replicas_of_a_deployment_on_a_gpu_another_gpu_could_hold(request):
    request = replace(request, strategy="memory-optimized" if request.strategy == "latency-sensitive"
                      else request.strategy)  # there, "could hold" also depends on the neighbours
    result = plan(request)
    free = {b.gpu: b.free_bytes for b in result.ledger}
    gpus = {g.id: g for g in request.gpus}
    for d in request.deployments:
        if d.spread == "none" or d.gpus_per_replica > 1:
            continue
        on = [r.gpus[0] for r in result.replicas if r.deployment == d.name and r.state == "ready"]
        stacked = {g for g in on if on.count(g) > 1}
        if stacked:
            room = [g for g in gpus.values() if g.id not in on and free[g.id] >= d.bytes and tolerates(d, g)
                    and all(g.labels.get(k) == v for k, v in d.selector.items())]
            assert not room, (d.name, stacked, [g.id for g in room])
        if d.spread == "required":
            assert not stacked, (d.name, on)


@RUN
@given(inputs(), st.data())
def test_a_tainted_gpu_only_gets_replicas_that_tolerate_it(request, data):
    first = plan(request)
    second = plan(carry_over(shaken(request, data.draw), first, request.now))
    deployments = {d.name: d for d in request.deployments}
    gpus = {g.id: g for g in request.gpus}
    for result in (first, second):
        for r in result.replicas:
            for g in r.gpus:
                assert tolerates(deployments[r.deployment], gpus[g]), (r.deployment, g)


def tolerates(d: Deployment, g: Gpu) -> bool:
    return all(d.tolerations.get(k) in (v, "*") for k, v in g.taints.items())
