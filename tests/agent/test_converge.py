from agent.converge import Running, device_for, plan_convergence
from agent.protocol import DesiredReplica, DesiredState
from agent.workers.spec import WorkerSpec


def desired(replica_id, path="/m/a", state="ready", gpus=(0,), dtype="float32", deployment="d"):
    return DesiredReplica(
        id=replica_id,
        deployment=deployment,
        model_path=path,
        architecture="LlamaForCausalLM",
        gpus=list(gpus),
        reserved_bytes=1,
        state=state,
        dtype=dtype,
    )


def running(replica_id, path="/m/a", state="ready", generation=1, device="cpu", deployment="d"):
    return Running(WorkerSpec(replica_id, path, "causal-lm", device, "float32", deployment), state, generation)


def test_it_starts_what_is_missing_and_stops_what_is_not_wanted():
    plan = plan_convergence(
        DesiredState(generation=2, replicas=[desired(1), desired(2)]), {2: running(2), 3: running(3)}, "cpu"
    )
    assert plan.stop == (3,) and [r.id for r in plan.start] == [1]
    assert "replica 3: stop (desired state is absent)" in plan.reasons


def test_it_stops_replicas_whose_target_is_stopped_or_sleeping():
    state = DesiredState(generation=2, replicas=[desired(1, state="stopped"), desired(2, state="sleeping")])
    plan = plan_convergence(state, {1: running(1), 2: running(2)}, "cpu")
    assert plan.stop == (1, 2) and plan.start == ()


def test_it_restarts_a_replica_whose_model_or_device_changed():
    plan = plan_convergence(
        DesiredState(generation=2, replicas=[desired(1, path="/m/b", gpus=[1])]),
        {1: running(1, device="cuda:0")},
        "cuda",
    )
    assert plan.stop == (1,) and [r.id for r in plan.start] == [1]
    assert plan.reasons == ("replica 1: restart (model_path, device changed)",)


def test_it_leaves_a_failed_replica_alone_until_a_new_generation():
    state = DesiredState(generation=1, replicas=[desired(1)])
    assert plan_convergence(state, {1: running(1, state="failed", generation=1)}, "cpu").start == ()
    retry = plan_convergence(
        DesiredState(generation=2, replicas=[desired(1)]), {1: running(1, state="failed", generation=1)}, "cpu"
    )
    assert retry.stop == (1,) and [r.id for r in retry.start] == [1]


def test_it_keeps_a_healthy_replica_running():
    plan = plan_convergence(DesiredState(generation=5, replicas=[desired(1)]), {1: running(1)}, "cpu")
    assert plan.stop == () and plan.start == ()


def test_the_device_is_the_first_gpu_on_cuda_hosts_and_the_cpu_otherwise():
    assert device_for(desired(1, gpus=[3, 4]), "cuda") == "cuda:3"
    assert device_for(desired(1, gpus=[3]), "cpu") == "cpu"
