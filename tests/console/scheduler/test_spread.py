"""Spread and taints: a deployment's replicas apart on GPUs, hosts and zones; tainted GPUs only for tolerating ones."""

from dataclasses import replace

import pytest

from console.scheduler import STRATEGIES, Deployment, Gpu, PlanInput, Replica, plan

GiB = 1024**3


def gpu(id, total_gib=24, taints=None, **labels):
    return Gpu(id=id, host=id.split("/")[0], total_bytes=int(total_gib * GiB), labels=labels, taints=taints or {})


def run(gpus, deployments, replicas=(), **kw):
    return plan(PlanInput(tuple(gpus), tuple(deployments), tuple(replicas), **kw))


def where(result, name):
    return [r.gpus for r in sorted(result.replicas, key=lambda r: r.index) if r.deployment == name and r.gpus]


def reason(result, name, index):
    return next(r.reason for r in result.replicas if (r.deployment, r.index) == (name, index))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_replicas_go_to_two_gpus_under_every_strategy(strategy):
    # Best fit and fill first would stack both on the GPU the first one tightened.
    result = run([gpu("a/0"), gpu("b/0")], [Deployment("m", 4 * GiB, replicas=2, priority="critical")],
                 strategy=strategy)
    assert sorted(where(result, "m")) == [("a/0",), ("b/0",)]
    assert "apart from the other replicas of m" in reason(result, "m", 1)


def test_they_go_to_another_host_before_another_gpu_of_the_same_host():
    result = run([gpu("a/0"), gpu("a/1"), gpu("b/0", 40)], [Deployment("m", 4 * GiB, replicas=2)])
    assert {g[0].split("/")[0] for g in where(result, "m")} == {"a", "b"}


def test_they_go_to_another_zone_before_another_host_of_the_same_zone():
    gpus = [gpu("a/0", zone="east"), gpu("b/0", zone="east"), gpu("c/0", 40, zone="west")]
    result = run(gpus, [Deployment("m", 4 * GiB, replicas=2)])
    assert {g[0][0] for g in where(result, "m")} & {"c"}
    assert len({g[0][0] for g in where(result, "m")}) == 2


def test_a_replica_shares_a_gpu_when_no_other_has_room_and_says_so():
    result = run([gpu("h/0"), gpu("h/1", 2)], [Deployment("m", 4 * GiB, replicas=2)])
    assert where(result, "m") == [("h/0",), ("h/0",)]
    assert "sharing h/0 with another replica: no GPU without one has room" in reason(result, "m", 1)


def test_a_replica_shares_a_host_when_no_other_host_has_room_and_says_so():
    result = run([gpu("a/0"), gpu("a/1"), gpu("b/0", 2)], [Deployment("m", 4 * GiB, replicas=2)])
    assert sorted(where(result, "m")) == [("a/0",), ("a/1",)]
    assert "on host a beside another replica: no host without one has room" in reason(result, "m", 1)


def test_required_spread_leaves_a_replica_unplaced_rather_than_share_and_names_why():
    result = run([gpu("h/0"), gpu("h/1", 2)], [Deployment("m", 4 * GiB, replicas=2, spread="required")])
    assert where(result, "m") == [("h/0",)]
    assert "1 GPU with room excluded: each holds a replica of it already (spread required)" in \
        result.unplaced[0].reason


def test_no_spread_leaves_placement_to_the_strategy():
    result = run([gpu("h/0"), gpu("h/1")], [Deployment("m", 4 * GiB, replicas=2, spread="none")],
                 strategy="fill-first")
    assert where(result, "m") == [("h/0",), ("h/0",)]


def test_a_spread_plan_is_stable_when_planned_again():
    request = PlanInput((gpu("a/0"), gpu("a/1"), gpu("b/0")), (Deployment("m", 4 * GiB, replicas=3),))
    first = plan(request)
    again = plan(replace(request, replicas=tuple(Replica(r.deployment, r.index, r.gpus, r.reserved_bytes)
                                                 for r in first.replicas if r.gpus)))
    assert {r.action for r in again.replicas} == {"keep"}


def test_replicas_already_sharing_a_gpu_are_not_moved_to_spread_them():
    existing = [Replica("m", 0, ("h/0",), 4 * GiB), Replica("m", 1, ("h/0",), 4 * GiB)]
    result = run([gpu("h/0"), gpu("h/1")], [Deployment("m", 4 * GiB, replicas=2)], existing)
    assert {r.action for r in result.replicas} == {"keep"}


def test_a_tainted_gpu_is_left_to_deployments_that_tolerate_it():
    pool = gpu("ml/0", 80, taints={"pool": "ml"})
    result = run([pool, gpu("h/0", 24)], [Deployment("web", 10 * GiB, replicas=3),
                                          Deployment("train", 30 * GiB, tolerations={"pool": "ml"})])
    assert where(result, "train") == [("ml/0",)]
    assert where(result, "web") == [("h/0",), ("h/0",)]
    assert "1 GPU excluded by taint pool=ml (not tolerated)" in result.unplaced[0].reason


def test_a_toleration_of_any_value_takes_every_value_of_the_taint():
    result = run([gpu("a/0", taints={"pool": "ml"}), gpu("b/0", taints={"pool": "batch"})],
                 [Deployment("m", 4 * GiB, replicas=2, tolerations={"pool": "*"})])
    assert sorted(where(result, "m")) == [("a/0",), ("b/0",)]


def test_a_toleration_does_not_make_a_tainted_gpu_the_only_choice():
    # Tolerating a taint allows the pool; it does not require it (a selector does that).
    result = run([gpu("ml/0", 80, taints={"pool": "ml"}), gpu("h/0", 24)],
                 [Deployment("m", 20 * GiB, tolerations={"pool": "ml"})])
    assert where(result, "m") == [("h/0",)]


def test_a_replica_on_a_gpu_tainted_since_is_displaced_and_says_why():
    result = run([gpu("h/0", taints={"pool": "ml"}), gpu("h/1")], [Deployment("m", 4 * GiB)],
                 [Replica("m", 0, ("h/0",), 4 * GiB)])
    assert where(result, "m") == [("h/1",)]
    assert "h/0 no longer matches its selector" in reason(result, "m", 0)


def test_no_gpu_without_a_taint_refuses_with_the_taint_named():
    result = run([gpu("h/0", taints={"pool": "ml"})], [Deployment("m", 4 * GiB)])
    assert result.unplaced[0].reason == ("needs 4.00 GiB; no GPU is available; 1 GPU excluded by taint pool=ml "
                                         "(not tolerated)")
