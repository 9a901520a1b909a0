"""Cold load: safetensors straight to the device, tensor by tensor, with progress (imports torch: workers only).

transformers builds the model on the meta device and fills it from the state dict it is given; we
give it lazy slices opened with `safe_open(..., device=...)`, so each tensor is read from the file
onto the device when transformers materialises it (never a second full copy in host memory), and
each read is counted. Key renames, tied weights and non-persistent buffers stay transformers' own
work, so the result is bit-identical to `from_pretrained(path)`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

from agent.artifacts import ModelArtifact, inspect_model_dir
from agent.artifacts.errors import ArtifactError
from agent.artifacts.safetensors_header import read_safetensors_header

ProgressCallback = Callable[[int, int], None]  # (loaded bytes, total bytes)

PROGRESS_STEP = 0.05  # report at least every 5% of the bytes ...
PROGRESS_INTERVAL_S = 0.25  # ... or every 250 ms, whichever comes first
MISMATCHES_NAMED = 3  # a failed load names this many tensors whose shapes the architecture does not take


@dataclass(frozen=True)
class LoadStats:
    bytes: int  # bytes read from the checkpoint files
    seconds: float  # from the first read to the model in eval mode on its device

    @property
    def bandwidth(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


def checkpoint_size(files: tuple[Path, ...]) -> int:
    """Bytes of tensor data in the files, from their headers."""
    return sum(t.nbytes for f in files for t in read_safetensors_header(f))


class Throttle:
    """Calls `report(loaded, total)` every PROGRESS_STEP of the total or PROGRESS_INTERVAL_S, and at the end."""

    def __init__(self, total: int, report: ProgressCallback, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.loaded = 0
        self._report = report
        self._clock = clock
        self._lock = threading.Lock()  # transformers materialises tensors from a thread pool
        self._last_bytes = 0
        self._last_time = clock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.loaded += nbytes
            now = self._clock()
            due = (
                self.loaded - self._last_bytes >= PROGRESS_STEP * self.total
                or now - self._last_time >= PROGRESS_INTERVAL_S
                or self.loaded >= self.total
            )
            if not due:
                return
            self._last_bytes, self._last_time = self.loaded, now
            # Reported under the lock: from the pool's threads, reports must leave in the order counted
            # or the agent sees progress go backwards.
            self._report(min(self.loaded, self.total), self.total)


class _CountedSlice:
    """A checkpoint tensor not yet read; transformers reads it with `[...]`, which we count."""

    def __init__(self, handle: Any, key: str, throttle: Throttle, own_copy_as: torch.dtype | None) -> None:
        self._handle = handle
        self._key = key
        self._slice = handle.get_slice(key)
        self._throttle = throttle
        self._own_copy_as = own_copy_as

    def get_shape(self) -> list[int]:
        return self._slice.get_shape()

    def get_dtype(self) -> str:
        return self._slice.get_dtype()

    def __getitem__(self, index: Any) -> torch.Tensor:
        tensor = self._handle.get_tensor(self._key) if index is Ellipsis else self._slice[index]
        if self._own_copy_as is not None and (tensor.dtype == self._own_copy_as or not tensor.is_floating_point()):
            # On the CPU safetensors hands out views of its private file mapping, read lazily on first
            # touch: copied here, the weights are resident when the replica says ready, and the load
            # reads the file (transformers' dtype conversion copies the other tensors anyway).
            tensor = tensor.clone()
        self._throttle.add(tensor.numel() * tensor.element_size())
        return tensor


def model_class(config: Any, task: str) -> type[PreTrainedModel]:
    """The transformers class AutoModelForCausalLM (causal-lm) or AutoModel (encoder) would pick."""
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING if task == "causal-lm" else MODEL_MAPPING
    candidates = mapping[type(config)]
    if not isinstance(candidates, (list, tuple)):
        return candidates
    by_name = {c.__name__: c for c in candidates}
    for name in getattr(config, "architectures", None) or []:
        if name in by_name:
            return by_name[name]
    return candidates[0]


def mismatch_text(model_path: str | Path, architecture: str, mismatched: Any) -> str:
    """Why a checkpoint does not fit the model config.json builds: each tensor (the first few) and both shapes."""
    items = sorted((key, list(ckpt), list(expected)) for key, ckpt, expected in mismatched)
    named = "; ".join(f"tensor {key!r} has shape {ckpt} in the checkpoint, but {architecture} built from config.json "
                      f"expects {expected}" for key, ckpt, expected in items[:MISMATCHES_NAMED])
    more = f"; and {len(items) - MISMATCHES_NAMED} more" if len(items) > MISMATCHES_NAMED else ""
    return f"{model_path}: {named}{more}"


def load_to_device(
    model_path: str | Path,
    task: str,
    dtype: torch.dtype,
    device: torch.device,
    progress: ProgressCallback | None = None,
    artifact: ModelArtifact | None = None,
) -> tuple[PreTrainedModel, LoadStats]:
    """Read the checkpoint onto `device` as `dtype`, reporting bytes read; the model is in eval mode.
    `artifact`: the directory as already read (its headers), so they are not read again."""
    artifact = artifact or inspect_model_dir(model_path)
    files = artifact.files
    throttle = Throttle(artifact.weights_bytes, progress or (lambda loaded, total: None))
    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    start = time.perf_counter()
    # safetensors places each tensor on the device as it reads it (through a per-tensor staging buffer).
    target = str(device) if device.type == "cuda" else "cpu"
    with contextlib.ExitStack() as files_open:
        handles = [files_open.enter_context(safe_open(str(f), framework="pt", device=target)) for f in files]
        own_copy_as = dtype if device.type == "cpu" else None
        state = {key: _CountedSlice(h, key, throttle, own_copy_as) for h in handles for key in h.keys()}
        # pretrained_model_name_or_path=None: transformers refuses a path together with a state dict;
        # the config carries everything the path would have given it.
        cls = model_class(config, task)
        # Mismatched shapes are taken (and reported) so that they can be named here: refused by transformers, they
        # end in "look at the above report!", the tensors and shapes left in the worker's log.
        model, info = cls.from_pretrained(
            None, config=config, state_dict=state, dtype=dtype, device_map={"": device},
            ignore_mismatched_sizes=True, output_loading_info=True,
        )
        del state
        if info["mismatched_keys"]:
            raise ArtifactError(mismatch_text(model_path, cls.__name__, info["mismatched_keys"]))
    model.eval()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    model.config.name_or_path = str(model_path)
    return model, LoadStats(bytes=throttle.loaded, seconds=seconds)
