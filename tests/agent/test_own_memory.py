"""A worker that drains toward sleep still holds its GPU's memory: the agent reports it as its own, on the GPU
it was on, never as a foreign process (which made the scheduler sleep and wake the replica that took its room)."""

from types import SimpleNamespace

from agent.gpus import SimulatedBackend
from agent.protocol import DesiredReplica
from agent.replicas import Replicas, ReplicaSettings

GiB = 1 << 30


class MeasuringBackend(SimulatedBackend):
    """Simulated GPUs that answer per-process readings, as NVML does."""

    def process_memory(self, pid: int) -> int | None:
        return 3 * GiB if pid == 4242 else None


def placed(state: str, gpus: list[int]) -> DesiredReplica:
    return DesiredReplica(id=7, deployment="victim", model_path="/m", architecture="LlamaForCausalLM", gpus=gpus,
                          state=state, reserved_bytes=3 * GiB if gpus else 0)


def test_a_draining_worker_is_counted_on_its_gpu_as_the_agents_own():
    replicas = Replicas(ReplicaSettings(), MeasuringBackend("sim:2x24GiB", host="h"), lambda handle, progress: None)
    draining = SimpleNamespace(spec=SimpleNamespace(replica_id=7), pid=4242, device_pids=[4242], measured_bytes=3 * GiB,
                               state="ready")
    replicas.supervisor.handles = lambda: [draining]
    replicas.place([placed("ready", [1])])
    replicas.place([placed("sleeping", [])])  # preempted: its worker has not finished going to sleep yet
    gpus = {g.index: g for g in replicas.gpus()}
    assert (gpus[1].used_bytes, gpus[1].own_bytes) == (3 * GiB, 3 * GiB)
    assert (gpus[0].used_bytes, gpus[0].own_bytes) == (0, 0)
