"""Worker-side measurement: the warm-up shape, the CPU probe, and the per-process limits."""

import os
import resource
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agent.workers import limits, memory_probe
from agent.workers.measure import CUDA_CONTEXT_ESTIMATE, measure_replica, warmup_inputs, warmup_shape
from agent.workers.spec import WorkerSpec


def test_the_warmup_shape_is_the_declared_one_clamped_to_the_positions_the_model_takes():
    llama = SimpleNamespace(model_type="llama", max_position_embeddings=4096)
    assert warmup_shape(llama, "causal-lm", 1, None) == (1, 2048)  # the estimator's default: min(max, 2048)
    assert warmup_shape(llama, "causal-lm", 4, 8000) == (4, 4096)
    assert warmup_shape(SimpleNamespace(model_type="gpt2", n_positions=1024), "causal-lm", 2, None) == (2, 1024)
    roberta = SimpleNamespace(model_type="roberta", max_position_embeddings=514, pad_token_id=1)
    assert warmup_shape(roberta, "encoder", 1, None) == (1, 512)  # positions start after the padding index
    assert warmup_shape(SimpleNamespace(model_type="t5"), "causal-lm", 1, None) == (1, 512)


def test_warmup_inputs_stay_inside_the_vocabulary():
    ids = warmup_inputs(3, 50, 100)["input_ids"]
    assert ids.shape == (3, 50) and ids.dtype == np.int64 and 0 < ids.min() and ids.max() < 100


def test_the_forward_peak_sees_torch_allocations():
    if not memory_probe.malloc_available():
        pytest.skip("glibc's mallinfo2 is not available here: the CPU probe measures nothing")
    size = 16 << 20

    def forward():
        a = torch.ones(size // 4)
        b = a * 2  # two live 16 MiB tensors at the peak
        return float(b.sum())

    peak = memory_probe.forward_peak_bytes(forward)
    assert peak >= 2 * size


def test_weights_count_shared_storages_once():
    lin = torch.nn.Linear(1000, 10, bias=False)
    model = torch.nn.Sequential(lin, torch.nn.Linear(10, 1000, bias=False))
    model[1].weight = torch.nn.Parameter(lin.weight.t())  # tied through a view of the same storage
    model.register_buffer("scale", torch.ones(5, dtype=torch.float64))
    assert memory_probe.weights_bytes(model) == 1000 * 10 * 4 + 5 * 8


def test_a_cpu_measurement_is_weights_plus_the_forward_peak():
    model = torch.nn.Linear(256, 1024)
    calls = []

    def forward(inputs):
        calls.append(inputs["input_ids"].shape)
        return model(torch.ones(inputs["input_ids"].shape[0], 256))

    m = measure_replica(model, torch.device("cpu"), forward, {"input_ids": np.ones((8, 3), dtype=np.int64)})
    assert calls == [(8, 3), (8, 3)]  # one call to warm up, one measured
    assert m["device"] == "cpu" and (m["batch"], m["seq"]) == (8, 3)
    assert m["weights_bytes"] == (256 * 1024 + 1024) * 4
    assert m["total_bytes"] == m["peak_bytes"] >= m["weights_bytes"] + 8 * 1024 * 4 * memory_probe.malloc_available()


def test_a_cuda_measurement_reads_the_allocator(monkeypatch):
    stats = {"allocated": 300, "max": 900, "reserved": 2048}
    fake = SimpleNamespace(
        synchronize=lambda device: None,
        reset_peak_memory_stats=lambda device: stats.update(max=0),
        memory_allocated=lambda device: stats["allocated"],
        max_memory_allocated=lambda device: stats["max"],
        memory_reserved=lambda device: stats["reserved"],
    )
    monkeypatch.setattr(torch, "cuda", fake)

    def forward(inputs):
        stats["max"] = 1500

    m = measure_replica(torch.nn.Linear(4, 4), torch.device("cuda", 0), forward, {"input_ids": np.ones((1, 7))})
    assert m["device"] == "cuda" and m["peak_bytes"] == 1500  # the peak was reset before the warm-up
    assert (m["allocated_bytes"], m["reserved_bytes"]) == (300, 2048)
    assert m["total_bytes"] == 2048 + CUDA_CONTEXT_ESTIMATE  # until the agent fills in NVML's reading


def test_the_reservation_becomes_the_cuda_memory_fraction():
    calls = []
    cuda = SimpleNamespace(set_per_process_memory_fraction=lambda f, d: calls.append((f, d)))
    fake_torch = SimpleNamespace(cuda=cuda)
    spec = WorkerSpec(1, "/m", "causal-lm", "cuda:1", reserved_bytes=20 << 30, gpu_total_bytes=80 << 30)
    device = torch.device("cuda", 1)
    assert "memory fraction 0.2500" in limits.apply_memory_limits(spec, fake_torch, device)
    assert calls == [(0.25, device)]
    assert limits.apply_memory_limits(WorkerSpec(1, "/m", "causal-lm", "cuda:1"), fake_torch, device) == ""


def test_the_mps_share_is_set_in_the_environment_before_cuda(monkeypatch):
    monkeypatch.delenv(limits.MPS_ENV, raising=False)
    limits.before_cuda(WorkerSpec(1, "/m", "causal-lm", "cuda:0"))
    assert limits.MPS_ENV not in os.environ
    limits.before_cuda(WorkerSpec(1, "/m", "causal-lm", "cuda:0", mps_percentage=30))
    assert os.environ[limits.MPS_ENV] == "30"


def test_a_cpu_cap_makes_big_allocations_fail_as_out_of_memory():
    # In a child process: an address-space cap cannot be lifted again.
    code = (
        "import torch, sys; from agent.workers import limits; from agent.workers.spec import WorkerSpec;"
        "limits.apply_memory_limits(WorkerSpec(1, '/m', 'causal-lm', memory_limit_bytes=64 << 20), torch,"
        " torch.device('cpu'));"
        "small = torch.ones(1 << 20);"
        "\ntry:\n  torch.ones(1 << 28)\nexcept Exception as e:\n  sys.exit(3 if limits.is_out_of_memory(e) else 4)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr
    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY  # this process is untouched


def test_it_tells_out_of_memory_from_other_failures():
    assert limits.is_out_of_memory(MemoryError())
    assert limits.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate"))
    assert limits.is_out_of_memory(type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried"))
    assert not limits.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not limits.is_out_of_memory(ValueError("bad input"))
