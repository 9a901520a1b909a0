"""The planner's basics: the ledger never overcommits, reservations and foreign memory count, refusals explain."""

import pytest

from console.scheduler import Deployment, Gpu, PlanInput, Replica, Settings, plan

GiB = 1024**3


def gpu(id, total_gib, used_gib=0, **labels):
    return Gpu(id=id, host=id.split("/")[0], total_bytes=int(total_gib * GiB), used_bytes=int(used_gib * GiB),
               labels=labels)


def run(gpus, deployments, replicas=(), **kw):
    return plan(PlanInput(tuple(gpus), tuple(deployments), tuple(replicas), **kw))


def ready(result):
    return {(r.deployment, r.index): r.gpus for r in result.replicas if r.state == "ready"}


def test_it_puts_a_replica_on_the_gpu_it_fits_most_tightly():
    result = run([gpu("a/0", 80), gpu("a/1", 24), gpu("b/0", 40)], [Deployment("m", 20 * GiB)])
    assert ready(result) == {("m", 0): ("a/1",)}
    assert result.replicas[0].reason == "best fit: needs 20.00 GiB; a/1 had 24.00 GiB free, 4.00 GiB left after"


def test_it_never_overcommits_a_gpu():
    result = run([gpu("h/0", 24), gpu("h/1", 24)], [Deployment("m", 10 * GiB, replicas=5)])
    per_gpu = {}
    for gpus in ready(result).values():
        per_gpu[gpus[0]] = per_gpu.get(gpus[0], 0) + 10
    assert per_gpu == {"h/0": 20, "h/1": 20}
    assert len(result.unplaced) == 1
    assert {b.gpu: b.free_bytes for b in result.ledger} == {"h/0": 4 * GiB, "h/1": 4 * GiB}


def test_it_counts_reservations_foreign_memory_and_the_buffer():
    existing = Replica("held", 0, ("h/0",), 10 * GiB)
    result = run([gpu("h/0", 24, used_gib=4)], [Deployment("held", 10 * GiB), Deployment("m", 9 * GiB)],
                 [existing], buffer_bytes=2 * GiB)
    assert ready(result) == {("held", 0): ("h/0",)}
    assert result.unplaced[0].reason == "needs 9.00 GiB; the largest free space is 8.00 GiB on h/0"


def test_it_never_lets_a_live_reading_shrink_a_reservation():
    # The replica reserved 30 GiB though its deployment now estimates 10: the ledger keeps 30.
    existing = Replica("m", 0, ("h/0",), 30 * GiB)
    result = run([gpu("h/0", 40)], [Deployment("m", 10 * GiB), Deployment("n", 15 * GiB)], [existing])
    assert ready(result) == {("m", 0): ("h/0",)}
    assert result.ledger[0].reserved_bytes == 30 * GiB


def test_it_explains_a_model_too_big_for_every_gpu():
    result = run([gpu("h/0", 24), gpu("h/1", 48)], [Deployment("huge", 100 * GiB)])
    assert result.unplaced[0].reason == "needs 100.00 GiB; the largest free space is 48.00 GiB on h/1"


def test_it_says_when_there_are_no_gpus_at_all():
    result = run([], [Deployment("m", GiB)])
    assert result.unplaced[0].reason == "needs 1.00 GiB; no GPU is available (no agent connected)"


def test_it_stops_replicas_of_deployments_that_no_longer_exist():
    result = run([gpu("h/0", 24)], [], [Replica("gone", 0, ("h/0",), GiB)])
    assert [(r.action, r.state, r.reason) for r in result.replicas] == [
        ("stop", "stopped", "stopped: its deployment no longer exists")]
    assert result.ledger[0].reserved_bytes == 0


def test_it_reports_gpus_in_use_and_their_memory_utilization():
    result = run([gpu("h/0", 10, used_gib=1), gpu("h/1", 10)], [Deployment("m", 4 * GiB)])
    assert result.gpus_used == 1
    assert result.memory_utilization == 0.5  # (1 foreign + 4 reserved) of 10


def test_it_splits_a_gang_replica_evenly_over_its_gpus():
    result = run([gpu("h/0", 24), gpu("h/1", 24), gpu("g/0", 80)], [Deployment("tp", 40 * GiB, gpus_per_replica=2)])
    assert ready(result) == {("tp", 0): ("h/0", "h/1")}
    assert [b.reserved_bytes for b in result.ledger] == [20 * GiB, 20 * GiB, 0]


def test_it_rejects_an_unknown_strategy():
    with pytest.raises(ValueError, match="unknown strategy 'densest'"):
        run([gpu("h/0", 24)], [Deployment("m", GiB)], strategy="densest")


def test_it_gives_mps_percentages_by_tier_on_shared_gpus():
    deployments = [Deployment("chat", 10 * GiB, priority="critical", latency_critical=True),
                   Deployment("crawl", 10 * GiB, priority="batch")]
    result = run([gpu("h/0", 80)], deployments)
    assert {r.deployment: r.mps_percentage for r in result.replicas} == {"chat": 80, "crawl": 20}
    assert "MPS 80% of SMs: weight 100 (critical, latency-critical) of 125 on h/0" in result.replicas[0].reason


def test_it_leaves_mps_off_for_a_replica_alone_on_its_gpu():
    result = run([gpu("h/0", 80)], [Deployment("m", GiB)])
    assert result.replicas[0].mps_percentage is None


def test_it_moves_one_replica_when_that_places_one_that_fits_nowhere_else():
    existing = Replica("small", 0, ("h/0",), 10 * GiB)
    deployments = [Deployment("small", 10 * GiB), Deployment("big", 35 * GiB)]
    result = run([gpu("h/0", 40), gpu("h/1", 15)], deployments, [existing])
    assert ready(result) == {("small", 0): ("h/1",), ("big", 0): ("h/0",)}
    [move] = result.moves
    assert (move.deployment, move.from_gpus, move.to_gpus) == ("small", ("h/0",), ("h/1",))
    assert "to make room for big#0 (standard), which fits nowhere else" in move.reason


def test_it_moves_nothing_when_moves_are_not_allowed():
    existing = Replica("small", 0, ("h/0",), 10 * GiB)
    deployments = [Deployment("small", 10 * GiB), Deployment("big", 35 * GiB)]
    result = run([gpu("h/0", 40), gpu("h/1", 15)], deployments, [existing], settings=Settings(max_moves=0))
    assert result.moves == ()
    assert [u.deployment for u in result.unplaced] == ["big"]


def test_it_moves_only_the_replicas_of_a_host_that_disappeared():
    gpus = [gpu(f"h{h}/{i}", 80) for h in range(3) for i in range(2)]
    first = run(gpus, [Deployment("m", 30 * GiB, replicas=6)], strategy="balance")
    current = [Replica(r.deployment, r.index, r.gpus, r.reserved_bytes) for r in first.replicas]
    second = run([g for g in gpus if g.host != "h2"], [Deployment("m", 30 * GiB, replicas=6)], current,
                 strategy="balance")
    lost = {r.index for r in first.replicas if r.host == "h2"}
    assert {m.index for m in second.moves} == lost and len(lost) == 2
    assert all("host h2 is gone" in m.reason for m in second.moves)
    assert {r.action for r in second.replicas if r.index not in lost} == {"keep"}


def test_it_displaces_a_replica_whose_gpu_filled_with_foreign_memory():
    existing = [Replica("m", 0, ("h/0",), 20 * GiB)]
    result = run([gpu("h/0", 24, used_gib=10), gpu("h/1", 24)], [Deployment("m", 20 * GiB)], existing)
    [move] = result.moves
    assert move.to_gpus == ("h/1",)
    assert "h/0 no longer has room for its 20.00 GiB: 14.00 GiB free with 10.00 GiB used by other processes" \
        in move.reason
