"""A desired replica as vLLM's command line: its model under the deployment's name, its memory held to the
reservation, LoRA sized for its adapters, and only the flags a deployment may set."""

import pytest

from agent.artifacts import ArtifactError
from agent.engines.vllm import RUNTIME_BYTES as VLLM_RUNTIME_BYTES
from agent.engines.vllm.launch import GIB, launch, lora_rank
from agent.protocol import DesiredAdapter, DesiredReplica
from tests.adapter_files import write_adapter


def replica(**extra) -> DesiredReplica:
    return DesiredReplica(**({"id": 3, "deployment": "chat", "model_path": "/models/llama", "gpus": [1],
                              "architecture": "LlamaForCausalLM", "reserved_bytes": 8 * GIB, "engine": "vllm"}
                             | extra))


def flag(args, name):
    return args[args.index(name) + 1]


def test_on_cpu_the_kv_cache_is_what_the_reservation_leaves_in_whole_gib_and_threads_are_shared():
    started = launch(replica(seq=512), "cpu", weights_bytes=2 * GIB, threads=2)
    env = dict(started.env)
    assert started.args[:2] == ("-m", "vllm.entrypoints.openai.api_server")
    assert (flag(started.args, "--model"), flag(started.args, "--served-model-name")) == ("/models/llama", "chat")
    assert (flag(started.args, "--host"), flag(started.args, "--max-model-len")) == ("127.0.0.1", "512")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str((8 * GIB - 2 * GIB - VLLM_RUNTIME_BYTES["cpu"]) // GIB)
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("nobind", "2")
    assert env["VLLM_REGEX_COMPILATION_TIMEOUT_S"] == "5"  # vLLM's own bound on a grammar's compile
    assert "--port" not in started.args and "--api-key" not in started.args  # the worker's, at start
    assert "--enable-lora" not in started.args and "--enable-sleep-mode" not in started.args
    # A reservation too small for any KV cache still gets vLLM's least, 1 GiB.
    assert dict(launch(replica(reserved_bytes=GIB), "cpu", weights_bytes=0).env)["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_on_cuda_the_reservation_is_its_share_of_the_gpu_and_it_can_sleep():
    started = launch(replica(reserved_bytes=20 * GIB), "cuda:1", weights_bytes=2 * GIB, gpu_total_bytes=80 * GIB)
    env = dict(started.env)
    assert flag(started.args, "--gpu-memory-utilization") == "0.2500"
    assert "--enable-sleep-mode" in started.args and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "VLLM_CPU_KVCACHE_SPACE" not in env
    tiny = launch(replica(reserved_bytes=1), "cuda:0", weights_bytes=0, gpu_total_bytes=80 * GIB)
    assert flag(tiny.args, "--gpu-memory-utilization") == "0.0200"


def test_lora_is_sized_for_the_adapters_listed(tmp_path):
    small = write_adapter(tmp_path / "a", {"model.layers.0.mlp.up_proj": (8, 16, 32)})
    wide = write_adapter(tmp_path / "b", {"model.layers.0.mlp.up_proj": (24, 16, 32)}, r=24)
    adapters = [DesiredAdapter(name="a", path=str(small)), DesiredAdapter(name="b", path=str(wide))]
    started = launch(replica(adapters=adapters), "cpu", weights_bytes=0)
    assert "--enable-lora" in started.args and flag(started.args, "--max-lora-rank") == "32"
    assert (flag(started.args, "--max-loras"), flag(started.args, "--max-cpu-loras")) == ("4", "16")
    # With a pool budget: as many device slots as it holds of the largest, and four times that on the host.
    largest = 24 * (16 + 32) * 4
    budgeted = launch(replica(adapters=adapters, adapter_pool_bytes=3 * largest), "cpu", weights_bytes=0)
    assert (flag(budgeted.args, "--max-loras"), flag(budgeted.args, "--max-cpu-loras")) == ("3", "12")
    with pytest.raises(ArtifactError, match="adapter 'gone'"):
        launch(replica(adapters=[DesiredAdapter(name="gone", path=str(tmp_path / "gone"))]), "cpu", weights_bytes=0)
    assert lora_rank(1) == 8 and lora_rank(320) == 320
    with pytest.raises(ArtifactError, match="LoRA rank 1024 is more than vLLM serves"):
        lora_rank(1024)


def test_a_deployments_own_flags_follow_and_only_those_it_may_set():
    started = launch(replica(engine_args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                          "--max-num-seqs=64"]), "cpu", weights_bytes=0)
    assert started.args[-4:] == ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-num-seqs=64")
    with pytest.raises(ArtifactError, match="'--port' is not one a deployment may set"):
        launch(replica(engine_args=["--port", "1"]), "cpu", weights_bytes=0)


def test_vllm_loads_safetensors_only():
    started = launch(replica(), "cpu", weights_bytes=0)
    assert flag(started.args, "--load-format") == "safetensors"  # its default falls back to pickled .bin files


def test_parallelism_spans_exactly_the_replicas_gpus_and_sees_them_all():
    tp = ["--tensor-parallel-size", "2"]
    started = launch(replica(gpus=[2, 3], engine_args=tp), "cuda:2", weights_bytes=0, gpu_total_bytes=80 * GIB)
    assert dict(started.env)["CUDA_VISIBLE_DEVICES"] == "2,3" and started.args[-2:] == tuple(tp)
    with pytest.raises(ArtifactError, match="make 2 GPUs per replica; this deployment's replicas have 1"):
        launch(replica(gpus=[1], engine_args=tp), "cuda:1", weights_bytes=0, gpu_total_bytes=80 * GIB)
    with pytest.raises(ArtifactError, match="'--max-num-seqs' takes an integer from 1 to 1,024, not '1e9'"):
        launch(replica(engine_args=["--max-num-seqs", "1e9"]), "cpu", weights_bytes=0)
