"""Hosts whose readings are stale (unknown, or not heard from since this scheduler began leading): the planner
neither places onto them nor takes from them; their replicas are held exactly as they are."""

from console.scheduler import Deployment, Gpu, Host, PlanInput, Replica, Settings, plan

GiB = 1024**3


def gpu(id, total_gib, used_gib=0, stale=False):
    return Gpu(id=id, host=id.split("/")[0], total_bytes=int(total_gib * GiB), used_bytes=int(used_gib * GiB),
               stale=stale)


def run(gpus, deployments, replicas=(), **kw):
    return plan(PlanInput(tuple(gpus), tuple(deployments), tuple(replicas), **kw))


def by_key(result):
    return {(r.deployment, r.index): r for r in result.replicas}


def test_a_replica_whose_estimate_grew_stays_on_a_stale_host_whatever_its_reading_says():
    # After a console restart the host's reading is the one from before, or a cordon: a calibrated estimate that
    # grew from 1.0 to 1.1 GiB no longer "fits" there, which stopped a healthy critical replica.
    held = Replica("crit", 0, ("h/0",), 1 * GiB, mps_percentage=36)
    result = run([gpu("h/0", 24, used_gib=23.5, stale=True)], [Deployment("crit", int(1.1 * GiB), priority="critical")],
                 [held])
    (r,) = result.replicas
    assert (r.state, r.action, r.gpus, r.reserved_bytes, r.mps_percentage) == ("ready", "keep", ("h/0",), 1 * GiB, 36)
    assert "readings are stale" in r.reason and result.moves == () and result.unplaced == ()


def test_nothing_is_placed_on_a_stale_host_even_with_room():
    result = run([gpu("h/0", 80, stale=True), gpu("g/0", 24)], [Deployment("m", 10 * GiB, replicas=3)])
    placed = {k: r.gpus for k, r in by_key(result).items() if r.state == "ready"}
    assert set(placed.values()) == {("g/0",)} and len(placed) == 2
    assert len(result.unplaced) == 1


def test_a_stale_hosts_replicas_are_never_preempted_moved_or_woken_elsewhere():
    replicas = [Replica("low", 0, ("h/0",), 20 * GiB), Replica("nap", 0, (), 0, "sleeping", host="h")]
    deployments = [Deployment("low", 20 * GiB, priority="batch"), Deployment("nap", 4 * GiB, priority="batch"),
                   Deployment("vip", 20 * GiB, priority="critical")]
    result = run([gpu("h/0", 24, stale=True), gpu("g/0", 24)], deployments, replicas, hosts=(Host("h", 100 * GiB),))
    got = by_key(result)
    assert (got["low", 0].action, got["low", 0].gpus) == ("keep", ("h/0",))
    assert (got["nap", 0].action, got["nap", 0].state, got["nap", 0].host) == ("keep", "sleeping", "h")
    assert got["vip", 0].gpus == ("g/0",)  # placed on the fresh GPU; nothing on h was taken for it


def test_held_replicas_count_towards_their_deployment_and_keep_their_indices():
    replicas = [Replica("m", 0, ("h/0",), 4 * GiB), Replica("m", 1, ("g/0",), 4 * GiB)]
    result = run([gpu("h/0", 24, stale=True), gpu("g/0", 24), gpu("g/1", 24)],
                 [Deployment("m", 4 * GiB, replicas=3)], replicas)
    got = by_key(result)
    assert sorted(got) == [("m", 0), ("m", 1), ("m", 2)]
    assert got["m", 0].gpus == ("h/0",) and got["m", 1].action == "keep" and got["m", 2].action == "place"


def test_a_scale_down_or_an_idle_timeout_takes_nothing_from_a_stale_host():
    replicas = [Replica("m", 0, ("h/0",), 4 * GiB), Replica("m", 1, ("g/0",), 4 * GiB)]
    down = run([gpu("h/0", 24, stale=True), gpu("g/0", 24)],
               [Deployment("m", 4 * GiB, replicas=1, min_replicas=1, max_replicas=1)], replicas)
    got = by_key(down)
    assert got["m", 0].action == "keep" and got["m", 1].action == "stop"
    idle = run([gpu("h/0", 24, stale=True)], [Deployment("m", 4 * GiB, replicas=1, min_replicas=0, max_replicas=1,
                                                         idle_timeout_s=60, active_at=0.0)],
               [Replica("m", 0, ("h/0",), 4 * GiB)], now=1000.0, settings=Settings(cooldown_s=0))
    assert by_key(idle)["m", 0].action == "keep"


def test_the_ledger_shows_a_stale_gpu_with_what_its_held_replicas_reserve():
    result = run([gpu("h/0", 24, stale=True), gpu("g/0", 24)], [Deployment("m", 4 * GiB)],
                 [Replica("m", 0, ("h/0",), 4 * GiB)])
    assert {b.gpu: b.reserved_bytes for b in result.ledger} == {"g/0": 0, "h/0": 4 * GiB}


def test_a_held_ready_replica_serves_its_deployments_waiting_requests():
    # After a console restart every host is stale until its agent speaks: requests waiting meanwhile are served by
    # the held replica, not lifted onto another GPU (nor refused when there is none).
    result = run([gpu("h/0", 24, stale=True), gpu("g/0", 24)], [Deployment("m", 4 * GiB, demand=3)],
                 [Replica("m", 0, ("h/0",), 4 * GiB)])
    assert [(r.index, r.action) for r in result.replicas] == [(0, "keep")]
    (outcome,) = result.demands
    assert outcome.status == "served" and "held" in outcome.reason


def test_requests_for_a_deployment_asleep_on_a_stale_host_wait_rather_than_being_refused():
    result = run([gpu("h/0", 24, stale=True), gpu("g/0", 24)], [Deployment("m", 4 * GiB, demand=3)],
                 [Replica("m", 0, (), 0, "sleeping", host="h")], hosts=(Host("h", 100 * GiB),))
    assert [(r.index, r.state, r.action) for r in result.replicas] == [(0, "sleeping", "keep")]
    (outcome,) = result.demands
    assert outcome.status == "waiting" and "sleep on h" in outcome.reason


def test_a_refusal_counts_the_hosts_whose_readings_are_stale():
    result = run([gpu("h/0", 24, stale=True)], [Deployment("m", 4 * GiB)])
    (unplaced,) = result.unplaced
    assert "no GPU is available; 1 host not counted: their readings are stale" in unplaced.reason
    assert "no agent connected" not in unplaced.reason

