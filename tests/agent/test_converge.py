from agent.converge import Running, device_for, plan_convergence
from agent.protocol import DesiredReplica, DesiredState
from agent.sleep_budget import Sleeper, fit
from agent.workers.spec import WorkerSpec

MIB = 1 << 20


def desired(replica_id, path="/m/a", state="ready", gpus=(0,), dtype="float32", deployment="d", mps=None):
    return DesiredReplica(
        id=replica_id,
        deployment=deployment,
        model_path=path,
        architecture="LlamaForCausalLM",
        gpus=list(gpus),
        reserved_bytes=1,
        state=state,
        dtype=dtype,
        mps_percentage=mps,
    )


def running(replica_id, path="/m/a", state="ready", generation=1, device="cpu", deployment="d", **extra):
    return Running(WorkerSpec(replica_id, path, "causal-lm", device, "float32", deployment), state, generation, **extra)


def plan(replicas, current, generation=2, **kwargs):
    return plan_convergence(DesiredState(generation=generation, replicas=replicas), current, "cpu", **kwargs)


def verbs(p):
    return [(a.verb, a.replica_id, a.target) for a in p.actions]


def test_it_starts_what_is_missing_and_stops_what_is_not_wanted():
    p = plan([desired(1), desired(2)], {2: running(2), 3: running(3)})
    assert p.stop == (3,) and [r.id for r in p.start] == [1]
    assert "replica 3: stop (desired state is absent)" in p.reasons


def test_it_moves_a_running_worker_between_ready_preloaded_and_sleeping_without_a_restart():
    current = {1: running(1, "/m/a", "ready"), 2: running(2, state="sleeping"), 3: running(3, state="preloaded"),
               4: running(4, state="ready")}
    p = plan([desired(1, state="sleeping"), desired(2), desired(3), desired(4, state="preloaded")], current)
    assert sorted(verbs(p)) == [("demote", 4, "preloaded"), ("promote", 3, "ready"), ("sleep", 1, "sleeping"),
                                ("wake", 2, "ready")]
    assert p.stop == () and p.start == ()


def test_a_switch_promotes_the_staged_replica_before_it_frees_the_old_one():
    # The console swaps B (staged) in for A in one generation: B serves before A stops serving.
    current = {1: running(1, state="ready"), 2: running(2, state="preloaded"), 3: running(3, state="sleeping"),
               4: running(4, state="ready")}
    replicas = [desired(1, state="sleeping"), desired(2), desired(3), desired(4, state="stopped"), desired(5)]
    assert [a.verb for a in plan(replicas, current).actions] == ["promote", "stop", "sleep", "wake", "start"]


def test_it_starts_a_replica_into_preloaded_or_sleeping_when_it_has_no_worker():
    p = plan([desired(1, state="preloaded"), desired(2, state="sleeping"), desired(3, state="stopped")], {})
    assert verbs(p) == [("start", 1, "preloaded"), ("start", 2, "sleeping")]
    assert p.reasons[1] == "replica 2: start d from /m/a (then sleeping)"


def test_a_loading_worker_is_retargeted_instead_of_restarted():
    p = plan([desired(1, state="sleeping"), desired(2)], {1: running(1, state="loading"),
                                                           2: running(2, state="starting", target="ready")})
    assert verbs(p) == [("retarget", 1, "sleeping")]


def test_it_restarts_a_replica_whose_model_or_device_changed_but_not_for_a_new_mps_share():
    p = plan_convergence(
        DesiredState(generation=2, replicas=[desired(1, path="/m/b", gpus=[1])]),
        {1: running(1, device="cuda:0")},
        "cuda",
    )
    assert p.stop == (1,) and [r.id for r in p.start] == [1]
    assert p.reasons[0] == "replica 1: restart (model_path, device changed)"
    # A neighbour arriving or leaving changes the MPS share; that must not cost a reload.
    assert plan([desired(1, mps=40)], {1: running(1)}).actions == ()


def test_it_leaves_a_failed_or_evicted_replica_alone_until_a_new_generation():
    for state in ("failed", "stopped"):
        assert plan([desired(1)], {1: running(1, state=state, generation=1)}, generation=1).actions == ()
        retry = plan([desired(1, state="sleeping")], {1: running(1, state=state, generation=1)}, generation=2)
        assert verbs(retry) == [("stop", 1, "stopped"), ("start", 1, "sleeping")]


def test_it_keeps_a_healthy_replica_running():
    assert plan([desired(1)], {1: running(1)}, generation=5).actions == ()


def test_a_ready_replica_asked_to_sleep_sleeps_under_any_generation():
    # Requests never wake a replica, so nothing keeps one awake against the console's desired state.
    for generation in (1, 2):
        current = {1: running(1, state="ready", generation=1)}
        assert verbs(plan([desired(1, state="sleeping")], current, generation=generation)) == [("sleep", 1, "sleeping")]


def test_a_sleeping_replica_asked_to_preload_wakes_onto_its_gpu_only_if_there_is_room():
    current = {1: running(1, state="sleeping", weights_bytes=600), 2: running(2, state="sleeping", weights_bytes=600)}
    replicas = [desired(1, state="preloaded"), desired(2, state="preloaded")]
    assert verbs(plan(replicas, current, free_bytes={0: 1000})) == [("wake", 1, "preloaded")]  # room for one
    assert plan(replicas, current, free_bytes={0: 100}).actions == ()  # both stay asleep, host copies ready


def test_sleeping_beyond_the_host_budget_evicts_the_least_recently_used():
    current = {
        1: running(1, state="sleeping", weights_bytes=400 * MIB, last_used=10.0),
        2: running(2, state="sleeping", weights_bytes=400 * MIB, last_used=30.0),
        3: running(3, state="ready", weights_bytes=400 * MIB, last_used=20.0),
    }
    replicas = [desired(1, state="sleeping"), desired(2, state="sleeping"), desired(3, state="sleeping")]
    p = plan(replicas, current, sleep_budget=1000 * MIB)
    assert verbs(p) == [("evict", 1, "stopped"), ("sleep", 3, "sleeping")]
    evict = p.actions[0]
    assert evict.detail.startswith("evicted from host memory: sleeping replicas needed 1,200.0 MiB, more than")
    assert "least recently used" in evict.detail and p.stop == (1,)


def test_a_replica_bigger_than_the_whole_budget_is_stopped_instead_of_put_to_sleep():
    current = {1: running(1, state="sleeping", weights_bytes=100, last_used=1.0),
               2: running(2, state="ready", weights_bytes=5000, last_used=9.0)}
    p = plan([desired(1, state="sleeping"), desired(2, state="sleeping")], current, sleep_budget=1000)
    assert verbs(p) == [("evict", 2, "stopped")]  # the small one keeps sleeping
    assert "exceed the host-RAM budget" in p.actions[0].detail and "--sleep-budget" in p.actions[0].detail


def test_waking_or_stopping_replicas_free_their_share_of_the_budget():
    current = {1: running(1, state="sleeping", weights_bytes=600, last_used=1.0),
               2: running(2, state="ready", weights_bytes=600, last_used=2.0)}
    p = plan([desired(1), desired(2, state="sleeping")], current, sleep_budget=1000)
    assert sorted(verbs(p)) == [("sleep", 2, "sleeping"), ("wake", 1, "ready")]


def test_the_budget_fit_drops_oldest_first_and_only_as_many_as_needed():
    sleepers = [Sleeper(1, 300, 5.0), Sleeper(2, 300, 1.0), Sleeper(3, 300, 3.0), Sleeper(4, 300, 9.0)]
    assert sorted(fit(sleepers, 700)) == [2, 3]
    assert fit(sleepers, 1200) == {}


def test_the_device_is_the_first_gpu_on_cuda_hosts_and_the_cpu_otherwise():
    assert device_for(desired(1, gpus=[3, 4]), "cuda") == "cuda:3"
    assert device_for(desired(1, gpus=[3]), "cpu") == "cpu"


def test_a_replica_sent_to_sleep_without_a_gpu_is_slept_in_place_not_restarted():
    # The console lists no GPU and no MPS share for a sleeping replica: neither is a change on a CUDA host.
    spec = WorkerSpec(7, "/m/a", "causal-lm", "cuda:1", "float32", "d", mps_percentage=40)
    current = {7: Running(spec, "ready", 1, weights_bytes=10)}
    desired_state = DesiredState(generation=2, replicas=[desired(7, state="sleeping", gpus=())])
    assert verbs(plan_convergence(desired_state, current, "cuda")) == [("sleep", 7, "sleeping")]


def test_a_vllm_replica_restarts_for_a_new_engine_new_flags_or_its_first_adapters_and_not_otherwise():
    def vllm(**extra):
        return desired(1).model_copy(update={"engine": "vllm"} | extra)

    def on_vllm(args=(), flags=()):
        spec = WorkerSpec(1, "/m/a", "causal-lm", "cpu", "float32", "d", engine="vllm", engine_args=tuple(args),
                          engine_flags=tuple(flags))
        return {1: Running(spec, "ready", 1)}

    assert plan([vllm()], {1: running(1)}).reasons[0] == "replica 1: restart (engine changed)"
    assert plan([vllm()], on_vllm()).actions == ()
    tools = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert plan([vllm(engine_args=tools)], on_vllm()).reasons[0] == "replica 1: restart (engine arguments changed)"
    assert plan([vllm(engine_args=tools)], on_vllm(flags=tools)).actions == ()
    # vLLM serves adapters only when it started with LoRA: the first ones restart it, later ones and removals do not.
    adapters = [{"name": "sql", "path": "/a/sql"}]
    assert plan([vllm(adapters=adapters)], on_vllm()).reasons[0] == "replica 1: restart (LoRA changed)"
    assert plan([vllm(adapters=adapters)], on_vllm(args=["--enable-lora"])).actions == ()
    assert plan([vllm()], on_vllm(args=["--enable-lora"])).actions == ()


def test_a_new_artifact_revision_restarts_a_replica_even_from_the_same_path():
    # The console's rollout: the files at the same path were replaced, or its adapters changed; the worker is
    # restarted (drained by the daemon) with them, and a replica whose revision stands is left alone.
    spec = WorkerSpec(1, "/m/a", "causal-lm", "cpu", "float32", "d", revision=3)
    current = {1: Running(spec, "ready", 1)}
    assert plan([desired(1).model_copy(update={"revision": 3})], current).actions == ()
    p = plan([desired(1).model_copy(update={"revision": 4})], current)
    assert verbs(p) == [("stop", 1, "stopped"), ("start", 1, "ready")]
    assert p.reasons[0] == "replica 1: restart (artifact revision changed)"
    assert p.start[0].revision == 4


def test_a_replica_whose_engine_cannot_sleep_here_is_not_started_only_to_be_put_to_sleep():
    """vLLM cannot sleep on CPU: its replica asked to sleep is stopped instead. A new agent (a console restart in
    `manage.py up` restarts its agent too), or a new generation, started it again into sleeping: a full load, then
    stopped again, with no request waiting. On CUDA it sleeps, so it is still started into sleeping there."""
    asleep = desired(1, state="sleeping").model_copy(update={"engine": "vllm"})
    spec = WorkerSpec(1, "/m/a", "causal-lm", "cpu", "float32", "d", engine="vllm")
    for current in ({}, {1: Running(spec, "stopped", generation=1)}):
        assert plan_convergence(DesiredState(generation=2, replicas=[asleep]), current, "cpu").actions == ()
    assert verbs(plan_convergence(DesiredState(generation=2, replicas=[asleep]), {}, "cuda")) == [
        ("start", 1, "sleeping")]
    woken = asleep.model_copy(update={"state": "ready"})
    assert verbs(plan_convergence(DesiredState(generation=2, replicas=[woken]), {}, "cpu")) == [("start", 1, "ready")]
