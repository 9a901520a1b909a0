"""CPU workers (simulated GPUs): their share of the host's cores, and the memory cap they get by default."""


import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent import replicas as replicas_module
from agent.artifacts import inspect_model_dir
from agent.cli import build_parser
from agent.daemon import AgentConfig
from agent.gpus import SimulatedBackend
from agent.protocol import DesiredReplica, DesiredState
from agent.replicas import (
    CPU_CAP_PER_THREAD,
    CPU_CAP_SLACK,
    Replicas,
    ReplicaSettings,
    cpu_memory_limit,
    cpu_thread_share,
)
from agent.serving import make_app
from agent.serving.auth import GatewayAuth
from agent.workers.demo_models import build_tiny_llama
from tests.waiting import until

MIB = 1 << 20
SECRET = "gw-secret-for-cpu-tests"
AUTH = {"Authorization": f"Bearer {SECRET}"}


def desired(replica_id=1, deployment="chat", model_path="/models/chat", state="ready", reserved_bytes=64 * MIB):
    return DesiredReplica(id=replica_id, deployment=deployment, model_path=str(model_path),
                          architecture="LlamaForCausalLM", gpus=[0], state=state, reserved_bytes=reserved_bytes)


def replicas_on(gpus: str = "sim:2x24GiB", **settings) -> Replicas:
    return Replicas(ReplicaSettings(**settings), SimulatedBackend(gpus, host="cpu-test"), lambda handle, progress: None)


# --- the thread share ---------------------------------------------------------------------------


def test_the_default_share_divides_the_cores_among_the_gpus_or_the_replicas_when_more():
    assert cpu_thread_share(cores=16, gpus=2, replicas=1) == 8
    assert cpu_thread_share(cores=16, gpus=2, replicas=5) == 3
    assert cpu_thread_share(cores=2, gpus=4, replicas=1) == 1  # never below one thread
    assert cpu_thread_share(cores=2, gpus=0, replicas=0) == 2


def test_a_cpu_worker_spec_carries_the_configured_thread_count():
    spec = replicas_on(cpu_threads=3)._spec(desired(), "causal-lm", "cpu", file_bytes=10 * MIB)
    assert spec.threads == 3


def test_without_a_configured_count_a_cpu_worker_gets_its_share_of_the_host(monkeypatch):
    monkeypatch.setattr(replicas_module, "host_cores", lambda: 16)
    replicas = replicas_on("sim:2x24GiB")
    assert replicas._spec(desired(), "causal-lm", "cpu").threads == 8  # two simulated GPUs share 16 cores
    replicas._placements = {i: desired(i, state=s) for i, s in enumerate(["ready", "sleeping", "preloaded", "ready",
                                                                         "stopped"])}
    assert replicas._spec(desired(), "causal-lm", "cpu").threads == 4  # four replicas placed (one stopped)


def test_a_cuda_worker_keeps_torch_defaults_and_no_cap():
    spec = replicas_on(cpu_threads=3)._spec(desired(), "causal-lm", "cuda:0", file_bytes=10 * MIB)
    assert spec.threads is None and spec.memory_limit_bytes is None


def test_the_agent_config_and_command_line_carry_the_thread_count():
    assert AgentConfig(console="http://c", token="t", name="h", cpu_threads=2).replica_settings().cpu_threads == 2
    assert AgentConfig(console="http://c", token="t", name="h").replica_settings().cpu_threads is None
    args = build_parser().parse_args(["run", "--console", "http://c", "--cpu-threads", "3"])
    assert args.cpu_threads == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--console", "http://c", "--cpu-threads", "0"])


# --- the memory cap -----------------------------------------------------------------------------


def test_by_default_a_cpu_worker_is_held_to_its_reservation_plus_headroom():
    assert ReplicaSettings().cap_cpu_workers and AgentConfig(console="http://c", token="t", name="h").cap_cpu_workers
    spec = replicas_on(cpu_threads=2)._spec(desired(reserved_bytes=64 * MIB), "causal-lm", "cpu", file_bytes=10 * MIB)
    assert spec.memory_limit_bytes == 64 * MIB + 10 * MIB + CPU_CAP_SLACK + 2 * CPU_CAP_PER_THREAD
    assert spec.memory_limit_bytes == cpu_memory_limit(64 * MIB, 10 * MIB, 2)


def test_the_cap_can_be_turned_off_and_a_replica_without_a_reservation_is_not_capped():
    off = replicas_on(cap_cpu_workers=False, cpu_threads=2)._spec(desired(), "causal-lm", "cpu", file_bytes=MIB)
    assert off.memory_limit_bytes is None and off.threads == 2
    assert replicas_on()._spec(desired(reserved_bytes=0), "causal-lm", "cpu").memory_limit_bytes is None
    assert build_parser().parse_args(["run", "--console", "http://c"]).cap_cpu_workers is True
    assert build_parser().parse_args(["run", "--console", "http://c", "--no-cap-cpu-workers"]).cap_cpu_workers is False


# --- real workers -------------------------------------------------------------------------------


async def test_a_cpu_worker_runs_torch_on_the_thread_count_it_was_given(tmp_path):
    llama = build_tiny_llama(tmp_path / "tiny-llama")
    replicas = replicas_on("sim:1x24GiB", cpu_threads=3)
    try:
        await replicas.apply(DesiredState(generation=1, replicas=[desired(model_path=llama)]))
        handle = replicas.supervisor.get(1)
        assert handle.spec.threads == 3
        await until(lambda: handle.state in ("ready", "failed"), 120, "the worker to load")
        assert handle.state == "ready", handle.reason
        # The worker logs what torch reports after it applied the count (in its replica's log).
        assert "limits: torch threads: 3 intra-op, 1 inter-op" in "\n".join(replicas.supervisor.logs.tail(1, 1000))
    finally:
        await replicas.stop_all()


def build_wide_vocab_llama(directory):
    """A one-layer Llama with a 16k vocabulary but only 8 MiB of weights: its logits for the most tokens one
    request may carry (16384) take 1 GiB."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=16384, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


async def test_with_default_settings_a_request_beyond_the_cap_is_a_507_and_the_worker_serves_on(tmp_path):
    llama = build_wide_vocab_llama(tmp_path / "wide-vocab-llama")
    # Default settings but for the thread count, which is fixed so that the cap's size (16 MiB per thread)
    # does not depend on this host's cores. A 1 MiB reservation: the cap is then about 280 MiB.
    replicas = replicas_on("sim:1x24GiB", cpu_threads=1)
    client = TestClient(TestServer(make_app(replicas, auth=GatewayAuth(SECRET))), headers=AUTH)
    await client.start_server()
    try:
        await replicas.apply(DesiredState(generation=1, replicas=[desired(model_path=llama, reserved_bytes=MIB)]))
        handle = replicas.supervisor.get(1)
        file_bytes = inspect_model_dir(llama).weights_bytes
        assert handle.spec.memory_limit_bytes == cpu_memory_limit(MIB, file_bytes, 1)
        await until(lambda: handle.state in ("ready", "failed"), 120, "the worker to load")
        assert handle.state == "ready", handle.reason
        pid = handle.pid

        # Within what the server takes (64 x 256 tokens), but its logits alone are 64 x 256 x 16384 floats, 1 GiB.
        huge = {"inputs": [{"name": "input_ids", "shape": [64, 256], "datatype": "INT64", "data": [1] * (64 * 256)}]}
        response = await client.post("/v2/models/chat/infer", json=huge)
        assert response.status == 507
        assert (await response.json())["error"].startswith("model 'chat' cannot take this request: out of memory")

        ordinary = {"inputs": [{"name": "input_ids", "shape": [2, 6], "datatype": "INT64",
                                "data": [1, 5, 42, 7, 300, 2, 3, 3, 9, 100, 8, 1]}]}
        response = await client.post("/v2/models/chat/infer", json=ordinary)
        assert response.status == 200, await response.text()
        assert (await response.json())["outputs"][0]["shape"] == [2, 6, 16384]
        assert handle.state == "ready" and handle.pid == pid
    finally:
        await client.close()
        await replicas.stop_all()
