"""What a loaded replica really takes from its device, after a warm-up forward (imports torch: workers only).

* cuda: torch's allocator after the warm-up: memory_allocated, max_memory_allocated (reset before
  the warm-up) and memory_reserved. The CUDA context lives outside the allocator; the agent fills
  `process_bytes` from NVML (per-process memory, context included) since pynvml stays in the daemon.
  Without that reading, total = reserved + CUDA_CONTEXT_ESTIMATE.
* cpu: parameter and buffer bytes (shared storages once), plus the warm-up forward's malloc peak
  (agent.workers.memory_probe), the same method as bench/estimate_accuracy.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from agent.workers import memory_probe

# The CUDA context and library workspaces, outside torch's allocator; the estimator's allowance too.
CUDA_CONTEXT_ESTIMATE = 512 * 1024 * 1024
DEFAULT_SEQ_CAP = 2048  # the estimator's default shape: min(max positions, 2048)


def warmup_shape(config: Any, task: str, batch: int, seq: int | None) -> tuple[int, int]:
    """(batch, seq) for the warm-up: the declared shape, seq clamped to the positions the model takes."""
    limit = max_positions(config, task)
    if seq is None:
        seq = min(limit, DEFAULT_SEQ_CAP) if limit else 512
    if limit:
        seq = min(seq, limit)
    return max(1, int(batch)), max(1, int(seq))


def max_positions(config: Any, task: str) -> int:
    """The longest sequence the model takes (0: no table limit)."""
    limit = int(getattr(config, "max_position_embeddings", 0) or getattr(config, "n_positions", 0) or 0)
    if limit and getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        # RoBERTa numbers positions from padding_idx + 1, so two table rows are never used.
        limit -= int(getattr(config, "pad_token_id", 1) or 1) + 1
    return limit


def warmup_inputs(batch: int, seq: int, vocab_size: int) -> dict[str, np.ndarray]:
    """Deterministic token ids inside the vocabulary (the values do not change what is allocated)."""
    ids = (np.arange(batch * seq, dtype=np.int64).reshape(batch, seq) * 7919) % max(vocab_size - 1, 1) + 1
    return {"input_ids": ids}


def measure_replica(
    model: torch.nn.Module,
    device: torch.device,
    forward: Callable[[dict[str, np.ndarray]], Any],
    inputs: dict[str, np.ndarray],
) -> dict[str, Any]:
    """Run the warm-up forward and measure; returns the Measurement fields the worker knows."""
    batch, seq = inputs["input_ids"].shape
    weights = memory_probe.weights_bytes(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        forward(inputs)
        torch.cuda.synchronize(device)
        allocated = int(torch.cuda.memory_allocated(device))
        reserved = int(torch.cuda.memory_reserved(device))
        return {
            "device": "cuda",
            "batch": int(batch),
            "seq": int(seq),
            "weights_bytes": weights,
            "peak_bytes": int(torch.cuda.max_memory_allocated(device)),
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "total_bytes": reserved + CUDA_CONTEXT_ESTIMATE,  # the agent replaces it with NVML's reading
        }
    forward(inputs)  # first call: one-time allocations (oneDNN primitives, caches) stay out of the peak
    peak = memory_probe.forward_peak_bytes(lambda: forward(inputs)) if memory_probe.malloc_available() else 0
    return {
        "device": "cpu",
        "batch": int(batch),
        "seq": int(seq),
        "weights_bytes": weights,
        "peak_bytes": weights + peak,
        "total_bytes": weights + peak,
    }
