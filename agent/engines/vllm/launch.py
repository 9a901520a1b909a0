"""A desired replica as vLLM's command line and environment (daemon side, pure apart from reading adapter
headers). The worker adds the port and the key (server.py)."""

from __future__ import annotations

from agent.artifacts import ArtifactError
from agent.artifacts.adapters import read_adapter_dir
from agent.engines.base import Launch
from agent.engines.vllm import GIB, RUNTIME_BYTES, lora_rank
from agent.engines.vllm.settings import ALLOWLIST
from agent.protocol import DesiredReplica
from agent.protocol.engine_args import EngineArgsError, parse_engine_args

__all__ = ["GIB", "Launch", "launch", "lora_rank"]

CPU_RUNTIME_BYTES = RUNTIME_BYTES["cpu"]
MIN_LORA_SLOTS = 4  # device slots when the placement names no pool budget: adapters added later find room
MAX_LORA_SLOTS = 64  # vLLM preallocates every slot's weights on the device
MAX_HOST_LORA_SLOTS = 512
# On a GPU, vLLM takes this fraction of the device at most: the rest is the CUDA context's and NVML's.
MAX_GPU_FRACTION = 0.95
MIN_GPU_FRACTION = 0.02
# vLLM's one bound on a grammar's compile: a request's regex that takes longer fails (agent.serving.request_bounds
# bounds the rest). Set here, not left to an environment the agent was started with.
REGEX_COMPILE_TIMEOUT_S = 5


def launch(replica: DesiredReplica, device: str, weights_bytes: int, gpu_total_bytes: int = 0,
           threads: int | None = None) -> Launch:
    """vLLM's arguments for `replica` on `device` ("cpu" or "cuda:N"): its model under the deployment's name,
    its memory held to the reservation, and LoRA sized for the adapters its placement lists. ArtifactError when
    an adapter's directory cannot be read."""
    args = ["-m", "vllm.entrypoints.openai.api_server", "--model", replica.model_path,
            "--served-model-name", replica.deployment, "--host", "127.0.0.1", "--dtype", replica.dtype,
            "--disable-uvicorn-access-log", "--load-format", "safetensors"]  # never a pickled .bin beside them
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "VLLM_REGEX_COMPILATION_TIMEOUT_S": str(REGEX_COMPILE_TIMEOUT_S)}
    if replica.seq:
        args += ["--max-model-len", str(replica.seq)]
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib(replica.reserved_bytes, weights_bytes))
        # Several replicas share this host's cores: no pinning of each one's threads to the same cores.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
    else:
        # Every GPU of its placement: tensor and pipeline parallelism span them (their product is checked below).
        spans = [str(g) for g in replica.gpus] if len(replica.gpus) > 1 else [device.partition(":")[2] or "0"]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spans)
        env["VLLM_SERVER_DEV_MODE"] = "1"  # vLLM's /sleep and /wake_up are behind it
        args += ["--enable-sleep-mode", "--gpu-memory-utilization",
                 f"{gpu_fraction(replica.reserved_bytes, gpu_total_bytes):.4f}"]
    args += lora_args(replica)
    try:
        parse_engine_args(list(replica.engine_args), ALLOWLIST, gpus=len(replica.gpus) or None)
    except EngineArgsError as e:
        raise ArtifactError(str(e)) from None
    args += replica.engine_args
    return Launch(tuple(args), tuple(sorted(env.items())))


def cpu_kv_cache_gib(reserved_bytes: int, weights_bytes: int) -> int:
    """Whole GiB of KV cache (vLLM's CPU build takes no less) within the reservation, at least 1."""
    room = reserved_bytes - weights_bytes - CPU_RUNTIME_BYTES
    return max(1, room // GIB)


def gpu_fraction(reserved_bytes: int, total_bytes: int) -> float:
    """The reservation as vLLM's --gpu-memory-utilization: the share of the device it may take in all."""
    if not total_bytes or not reserved_bytes:
        return 0.9
    return min(MAX_GPU_FRACTION, max(MIN_GPU_FRACTION, reserved_bytes / total_bytes))


def lora_args(replica: DesiredReplica) -> list[str]:
    """LoRA enabled when the placement lists adapters: device slots for as many of the largest as the pool's device
    budget holds (else MIN_LORA_SLOTS, or one per adapter), host slots for as many as its host budget holds (at least
    one per adapter listed), and the largest rank among them. vLLM swaps adapters between its slots itself."""
    if not replica.adapters:
        return []
    found = []
    for adapter in replica.adapters:
        try:
            found.append(read_adapter_dir(adapter.path))
        except ArtifactError as e:
            raise ArtifactError(f"adapter {adapter.name!r}: {e}") from e
    rank = max(max(a.ranks.values(), default=a.r) for a in found)
    largest = max(a.bytes_at(replica.dtype) for a in found)
    on_device = max(MIN_LORA_SLOTS, len(found))
    if replica.adapter_pool_bytes and largest:
        on_device = replica.adapter_pool_bytes // largest
    on_device = max(1, min(on_device, MAX_LORA_SLOTS))
    host_budget = replica.adapter_host_bytes or 4 * replica.adapter_pool_bytes
    on_host = host_budget // largest if host_budget and largest else 4 * on_device
    on_host = max(on_device, len(found), min(on_host, MAX_HOST_LORA_SLOTS))
    return ["--enable-lora", "--max-loras", str(on_device), "--max-cpu-loras", str(on_host),
            "--max-lora-rank", str(lora_rank(rank))]
