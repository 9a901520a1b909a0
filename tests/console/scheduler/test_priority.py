"""Priority phases in detail: scale decisions, whom preemption picks, where a preempted replica goes."""

from console.scheduler import Deployment, Gpu, Host, PlanInput, Replica, Settings, plan
from console.scheduler.scaling import decide

GiB = 1024**3


def test_a_violating_deployment_scales_up_by_the_latency_ratio_up_to_its_maximum():
    dep = Deployment("chat", GiB, replicas=2, min_replicas=1, max_replicas=4, slo_latency_ms=200,
                     observed_latency_ms=500)
    decision = decide(dep, now=1000, settings=Settings())
    assert (decision.current, decision.target) == (2, 4)
    assert decision.reason == "violating its 200 ms p95 SLO at 500 ms: 2 -> 4 replicas (max 4)"


def test_a_violating_deployment_waits_out_the_cooldown():
    dep = Deployment("chat", GiB, replicas=2, max_replicas=4, violating=True, last_scale_at=970)
    decision = decide(dep, now=1000, settings=Settings(cooldown_s=120))
    assert decision.target == 2
    assert "within the cooldown (30 s of 2 min since the last change): stays at 2" in decision.reason


def test_a_quiet_deployment_steps_down_one_replica_never_below_its_minimum():
    dep = Deployment("web", GiB, replicas=1, min_replicas=1, max_replicas=3, status_since=0)
    assert decide(dep, now=10_000, settings=Settings()).target == 1
    dep = Deployment("web", GiB, replicas=3, min_replicas=1, max_replicas=3, status_since=0)
    assert decide(dep, now=10_000, settings=Settings()).target == 2


def test_without_a_known_quiet_time_nothing_is_scaled_down():
    dep = Deployment("web", GiB, replicas=3, min_replicas=1, max_replicas=3)
    decision = decide(dep, now=10_000, settings=Settings())
    assert decision.target == 3 and "for an unknown time" in decision.reason


def preemption(victims, ram=None):
    """One 40 GiB GPU full of `victims`; a critical deployment's minimum replica needs 20 GiB of it."""
    deployments = [Deployment("chat", 20 * GiB, priority="critical")] + [d for d, _ in victims]
    replicas = [Replica(d.name, i, ("h/0",), size) for d, size in victims for i in range(d.replicas)]
    hosts = () if ram is None else (Host("h", ram),)
    result = plan(PlanInput((Gpu("h/0", "h", 40 * GiB),), tuple(deployments), tuple(replicas), hosts))
    return {(r.deployment, r.index): r for r in result.replicas}


def test_preemption_takes_replicas_above_their_minimum_first():
    at_min = Deployment("base", 20 * GiB, priority="batch")
    above = Deployment("burst", 20 * GiB, replicas=1, min_replicas=0, max_replicas=1, priority="standard")
    out = preemption([(at_min, 20 * GiB), (above, 20 * GiB)])
    assert out[("burst", 0)].action == "preempt" and out[("base", 0)].action == "keep"


def test_preemption_takes_the_lowest_tier_then_the_least_traffic():
    high = Deployment("high", 10 * GiB, priority="high")
    busy = Deployment("busy", 10 * GiB, priority="batch", traffic_rps=40)
    idle = Deployment("idle", 10 * GiB, priority="batch", traffic_rps=1)
    std = Deployment("std", 10 * GiB, priority="standard")
    out = preemption([(high, 10 * GiB), (busy, 10 * GiB), (idle, 10 * GiB), (std, 10 * GiB)])
    assert {k[0] for k, r in out.items() if r.action == "preempt"} == {"idle", "busy"}
    used = Deployment("used", 10 * GiB, priority="standard", traffic_rps=5)
    out = preemption([(high, 10 * GiB), (busy, 10 * GiB), (used, 10 * GiB), (std, 10 * GiB)])
    assert {k[0] for k, r in out.items() if r.action == "preempt"} == {"busy", "std"}  # batch, then idle standard


def test_a_preempted_replica_stops_when_its_host_reports_no_ram_for_sleeping():
    victim = Deployment("crawl", 30 * GiB, priority="batch")
    out = preemption([(victim, 30 * GiB)])
    assert (out[("crawl", 0)].state, out[("crawl", 0)].preempted_by) == ("stopped", "chat#0")
    assert out[("crawl", 0)].reason == ("preempted by chat#0 (critical, needs its minimum of 1 replica); "
                                        "stopped: h reports no host RAM for sleeping replicas")
    out = preemption([(victim, 30 * GiB)], ram=64 * GiB)
    assert out[("crawl", 0)].state == "sleeping" and out[("crawl", 0)].host == "h"


def test_a_reason_names_another_teams_replica_only_as_a_replica_of_another_team():
    theirs = preemption([(Deployment("crawl", 30 * GiB, priority="batch", team=2), 30 * GiB)])[("crawl", 0)]
    assert theirs.reason.startswith("preempted by a replica of another team (critical, needs its minimum")
    assert "chat" not in theirs.reason and theirs.preempted_by == "a replica of another team"
    ours = preemption([(Deployment("crawl", 30 * GiB, priority="batch", team=None), 30 * GiB)])[("crawl", 0)]
    assert ours.reason.startswith("preempted by chat#0 (critical")  # one team (chat's is None too): named


def test_a_preempted_replica_that_fits_elsewhere_moves_instead():
    gpus = (Gpu("h/0", "h", 40 * GiB), Gpu("h/1", "h", 24 * GiB))
    deployments = (Deployment("chat", 30 * GiB, priority="critical"), Deployment("crawl", 20 * GiB, priority="batch"),
                   Deployment("fill", 20 * GiB, priority="batch"))
    replicas = (Replica("crawl", 0, ("h/0",), 20 * GiB), Replica("fill", 0, ("h/0",), 20 * GiB))
    result = plan(PlanInput(gpus, deployments, replicas, settings=Settings(max_moves=0)))
    by = {r.deployment: r for r in result.replicas}
    assert by["chat"].gpus == ("h/0",)
    moved = [r for r in result.replicas if r.action == "move"]
    assert len(moved) == 1 and moved[0].gpus == ("h/1",)
    assert "preempted by chat#0" in moved[0].reason


def test_preemption_is_off_when_the_settings_say_so():
    victim = Deployment("crawl", 30 * GiB, priority="batch")
    request = PlanInput((Gpu("h/0", "h", 40 * GiB),), (Deployment("chat", 20 * GiB, priority="critical"), victim),
                        (Replica("crawl", 0, ("h/0",), 30 * GiB),), settings=Settings(preempt=False))
    result = plan(request)
    assert [u.deployment for u in result.unplaced] == ["chat"]
