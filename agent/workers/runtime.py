"""Load a model, run forward passes, sleep and wake. Imported only inside worker processes: it imports torch."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel  # imported early on purpose: see LoadedModel

from agent.artifacts import ArtifactError, ModelArtifact, inspect_model_dir
from agent.artifacts.config import ModelConfig
from agent.artifacts.memory import kv_cache_elements
from agent.workers import limits, loader
from agent.workers.adapter_pool import AdapterPool
from agent.workers.continuous import ContinuousBatcher
from agent.workers.generation_spec import PromptError
from agent.workers.measure import measure_replica, warmup_inputs, warmup_shape
from agent.workers.prefix_cache import PrefixCache
from agent.workers.spec import DTYPES, SIGNATURES, WorkerSpec
from agent.workers.swap import WeightSwap

log = logging.getLogger("agent.worker")

Command = Callable[[Any], Any]


_NO_POOL = {"adapters": [], "totals": {"hits": 0, "misses": 0, "evictions": 0, "adapters": 0}}


class InputError(PromptError):
    """A request the model cannot take; the message names the tensor and the problem."""


class LoadedModel:
    """A transformers model in eval mode on its device: the worker's engine (agent.workers.engine.Engine), with
    forwards as commands and generations in its continuous batcher."""

    # Importing PreTrainedModel above (transformers.modeling_utils) is what the first from_pretrained
    # would otherwise do, 2 s and more: a warm spare worker (agent.workers.spares) thus pays it early.

    def __init__(
        self, spec: WorkerSpec, model: PreTrainedModel, device: torch.device, stats: loader.LoadStats | None = None,
        artifact: ModelArtifact | None = None,
    ) -> None:
        self.spec = spec
        self.artifact = artifact  # the directory's headers, read once at load (the adapter pool checks shapes)
        self.model = model
        self.device = device
        self.load_stats = stats
        self.swap = WeightSwap(model, device)
        self.pool: AdapterPool | None = None  # made on the first adapter, so a plain model is untouched
        self.reserved_bytes = spec.reserved_bytes  # what its limits allow now: the console may grow it in place
        self._batcher: ContinuousBatcher | None = None
        # What the agent may ask of this worker by name: (command, request id, payload).
        # A new worker command is one more entry here (and a WorkerHandle.call on the agent side).
        self.commands: dict[str, Command] = {
            "infer": self.infer,
            "infer_mixed": lambda p: self.infer(p["inputs"], p["adapters"]),
            "adapters": self.configure_adapters,
            "adapter_stats": lambda _payload: {"stats": self.pool.stats() if self.pool else _NO_POOL},
            "sleep": self.sleep,
            "wake": self.wake,
        }
        self.signature = SIGNATURES[spec.task]
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.type_vocab_size = int(getattr(config, "type_vocab_size", 0) or 0)
        # Every architecture's sequence is bounded: learned position tables (encoders, GPT-2) would be indexed
        # past their end, and a decoder's memory grows with the length (a [1, 10000000] request took 16 GB).
        from agent.workers.measure import max_positions  # RoBERTa's position offset counted, as for warm-up

        self.max_positions = max_positions(config, spec.task)
        self.output_dim = self.vocab_size if spec.task == "causal-lm" else int(config.hidden_size)

    def describe(self) -> dict[str, int]:
        """Facts the daemon shows in model metadata, and the KV share of its reservation (for its KV usage)."""
        return {"output_dim": self.output_dim, "vocab_size": self.vocab_size, "max_positions": self.max_positions,
                "kv_capacity_bytes": self.kv_capacity_bytes()}

    def kv_capacity_bytes(self) -> int:
        """The KV cache its reservation was estimated with: its declared batch of sequences at its declared length,
        at its dtype (agent.artifacts.estimate's term). 0 when the model has no KV cache or the config is unread."""
        if self.spec.task != "causal-lm" or self.artifact is None or not self.artifact.config:
            return 0
        batch, seq = warmup_shape(self.model.config, self.spec.task, self.spec.batch, self.spec.seq)
        try:
            elements, _ = kv_cache_elements(ModelConfig(self.artifact.config), batch, seq)
        except ArtifactError as e:  # a config the estimator cannot size: no usage rather than a wrong one
            log.info("KV capacity unknown: %s", e)
            return 0
        return elements * self.model.dtype.itemsize

    def measure(self) -> dict[str, Any]:
        """Warm up at the spec's shape and measure what this replica takes (Measurement fields)."""
        batch, seq = warmup_shape(self.model.config, self.spec.task, self.spec.batch, self.spec.seq)
        inputs = warmup_inputs(batch, seq, self.vocab_size)
        result = measure_replica(self.model, self.device, self.infer, inputs)
        if self.load_stats is not None:
            result["load_seconds"] = self.load_stats.seconds
            result["load_bandwidth"] = self.load_stats.bandwidth
        return result

    def configure_adapters(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Unload, load (and pin) adapters and take the console's demand hints; a refused adapter is
        reported, the others still apply. Returns the pool's stats and the refusals (`failures`: each refused
        adapter's reason, which requests for it are answered with)."""
        self._grow_reservation(payload.get("reserved_bytes", 0))
        if self.pool is None:
            self.pool = AdapterPool(self.model, gpu_budget=payload["gpu_budget"], cpu_budget=payload["cpu_budget"],
                                    base=self.artifact or inspect_model_dir(self.spec.model_path))
        else:
            # The budgets follow the console's grant: an adapter bigger than the first ones then fits.
            for tier, (before, after) in self.pool.grow(payload["gpu_budget"], payload["cpu_budget"]).items():
                log.info("adapter pool: %s tier grown from %d to %d bytes", tier, before, after)
        failures = {}
        for name in payload.get("unload", ()):
            self.pool.unload(name)
            self._forget_prefixes(name)
        for adapter in payload.get("load", ()):
            self._forget_prefixes(adapter["name"])  # a name loaded again may hold other weights
            try:
                self.pool.load(adapter["name"], adapter["path"], pin=adapter.get("pinned", False))
                if not adapter.get("pinned", False):
                    self.pool.unpin(adapter["name"])  # the console took its pin away
            except (ValueError, OSError) as e:  # ArtifactError and AdapterRefused are ValueErrors
                failures[adapter["name"]] = str(e)
        if payload.get("hints"):
            self.pool.hint(payload["hints"])
            self.pool.prefetch()
        return {"stats": self.pool.stats(), "errors": [f"adapter {n!r}: {why}" for n, why in failures.items()],
                "failures": failures}

    def _grow_reservation(self, reserved: int) -> None:
        """Raise the worker's memory limits to a reservation the console grew in place (see limits)."""
        applied = limits.grow_memory_limits(self.spec, torch, self.device, self.reserved_bytes, reserved)
        if reserved > self.reserved_bytes and self.reserved_bytes:
            self.reserved_bytes = reserved
        if applied:
            log.info("limits: %s", applied)

    def _forget_prefixes(self, adapter: str) -> None:
        if self._batcher is not None and self._batcher.prefix_cache is not None:
            self._batcher.prefix_cache.forget(adapter)

    @property
    def asleep(self) -> bool:
        return self.swap.asleep

    @property
    def batcher(self) -> ContinuousBatcher | None:
        """The replica's generation engine (causal LMs; None for encoders), made on first use."""
        if self.spec.task != "causal-lm":
            return None
        if self._batcher is None:
            # Cached prefixes share the KV part of the reservation with the running sequences (none when unknown).
            capacity = self.kv_capacity_bytes()
            self._batcher = ContinuousBatcher(self.model, self._adapters, max_positions=self.max_positions,
                                              prefix_cache=PrefixCache(capacity) if capacity else None)
        return self._batcher

    def _adapters(self, names: list[str | None]):
        """Rows' adapters for the forwards inside the block (a no-op without adapters)."""
        if all(n is None for n in names):
            return contextlib.nullcontext()
        if self.pool is None:
            raise InputError(f"no adapters are loaded in this replica (asked for {sorted(set(filter(None, names)))})")
        unknown = sorted({n for n in names if n is not None and n not in self.pool.tiers.adapters})
        if unknown:
            raise InputError(f"adapter {unknown[0]!r} is not loaded in this replica")
        return self.pool.serving(names)

    def sleep(self, _payload: Any = None) -> dict[str, Any]:
        """Move the weights to host memory and free the device (see agent.workers.swap)."""
        if self.pool is not None:
            self.pool.offload()  # its device tier would otherwise keep device memory while asleep
        if self._batcher is not None and self._batcher.prefix_cache is not None:
            self._batcher.prefix_cache.clear()  # device memory too; a woken replica fills it again
        with torch.no_grad():
            transfer = self.swap.sleep()
        return transfer.as_dict() | {"host_bytes": self.swap.host_bytes}

    def after_reply(self, kind: str) -> None:
        """Work that need not hold up the agent's answer. After a sleep on CUDA: a full garbage collection
        for anything a reference cycle still held of the old weights, then the freed blocks back to the
        driver (the swap already dropped every reference the model holds). It takes ~200 ms with torch and
        transformers loaded, which a replica waiting to wake into this GPU would otherwise wait for. On the
        CPU nothing is handed back to a device, so the collection would only take a core from the replica
        that just woke. After a wake: the host copy's page lock is released (agent.workers.swap)."""
        if kind == "wake":
            self.swap.release_host()
        if kind == "sleep" and self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    def wake(self, _payload: Any = None) -> dict[str, Any]:
        """Copy the weights back onto the device; serves again, bit for bit as before."""
        with torch.no_grad():
            transfer = self.swap.wake()
        if self.pool is not None:
            self.pool.restore()
        return transfer.as_dict() | {"host_bytes": self.swap.host_bytes}

    def recover_from_oom(self) -> None:
        """After an allocation failed: free what the failed call left, so the next one can run."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def infer(self, inputs: dict[str, np.ndarray], adapters: list[str | None] | None = None) -> dict[str, np.ndarray]:
        """One forward pass over a batch of token ids, row i with adapter adapters[i] (None: the base
        model); returns the task's output tensor as float32."""
        if self.swap.asleep:
            raise RuntimeError("the model is asleep: wake it before inference")
        tensors = self._check(inputs)
        rows = tensors["input_ids"].shape[0]
        if adapters is not None and len(adapters) != rows:
            raise InputError(f"{len(adapters)} adapter names for a batch of {rows} rows")
        with self._adapters(adapters or [None] * rows):
            return self._forward(tensors)

    def _forward(self, tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        if self.spec.task == "causal-lm":
            out = self.model(**tensors, use_cache=False)
            return {"logits": out.logits.float().cpu().numpy()}
        out = self.model(**tensors)
        return {"embeddings": mean_pool_normalize(out.last_hidden_state, tensors["attention_mask"]).cpu().numpy()}

    def _check(self, inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        known = {t.name for t in self.signature.inputs}
        unknown = sorted(set(inputs) - known)
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; this model takes {', '.join(sorted(known))}")
        if "input_ids" not in inputs:
            raise InputError("missing input 'input_ids'")
        ids = _int_matrix("input_ids", inputs["input_ids"])
        if self.max_positions and ids.shape[1] > self.max_positions:
            raise InputError(
                f"input 'input_ids' has {ids.shape[1]} tokens per row; this model takes at most {self.max_positions} "
                "(its max_position_embeddings)"
            )
        _check_range("input_ids", ids, self.vocab_size)
        tensors = {"input_ids": ids}
        for name in ("attention_mask", "token_type_ids"):
            if name in inputs:
                tensors[name] = _int_matrix(name, inputs[name])
                if tensors[name].shape != ids.shape:
                    raise InputError(
                        f"input {name!r} has shape {list(tensors[name].shape)} but input_ids has {list(ids.shape)}"
                    )
        if "token_type_ids" in tensors:
            _check_range("token_type_ids", tensors["token_type_ids"], self.type_vocab_size)
        if "attention_mask" in tensors:  # any other value would weight or mask tokens in ways no client means
            _check_range("attention_mask", tensors["attention_mask"], 2, "0 (padding) or 1 (a token)")
        if self.spec.task == "encoder" and "attention_mask" not in tensors:
            tensors["attention_mask"] = np.ones_like(ids)
        return {name: torch.from_numpy(value).to(self.device) for name, value in tensors.items()}


def mean_pool_normalize(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings as sentence-transformers makes them: mean over unmasked tokens, then L2 norm."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return F.normalize((summed / counts).float(), p=2, dim=1)


def load(spec: WorkerSpec, progress: loader.ProgressCallback | None = None,
         artifact: ModelArtifact | None = None) -> LoadedModel:
    """Load the model directory from safetensors only, in eval mode on the spec's device, within its limits.
    `artifact`: the directory as the caller already read it (else it is read here)."""
    if spec.task not in SIGNATURES:
        raise ValueError(f"task {spec.task!r} is not servable (causal-lm or encoder)")
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype {spec.dtype!r} is not supported ({', '.join(DTYPES)})")
    # Checked first, torch-free, for a message that names the file; transformers would otherwise
    # take a missing directory for a Hub repository id.
    artifact = artifact or inspect_model_dir(spec.model_path)
    if artifact.task != spec.task:
        raise ValueError(f"{spec.model_path} is a {artifact.task} model ({artifact.architecture}), not {spec.task}")
    device = torch.device(spec.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{spec.device} asked for, but this worker's torch {torch.__version__} sees no CUDA GPU")
        torch.cuda.set_device(device)
    applied = limits.apply_memory_limits(spec, torch, device)
    if applied:
        log.info("limits: %s", applied)
    model, stats = loader.load_to_device(spec.model_path, spec.task, getattr(torch, spec.dtype), device, progress,
                                         artifact)
    return LoadedModel(spec, model, device, stats, artifact)


def _int_matrix(name: str, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"input {name!r} must be a non-empty [batch, sequence] matrix, got shape {list(array.shape)}")
    if not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"input {name!r} must hold integers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _check_range(name: str, array: np.ndarray, limit: int, allowed: str = "") -> None:
    # An id past the embedding table is an IndexError on the CPU but a device-side assert that
    # poisons the whole CUDA context on a GPU, so it is refused before the forward pass.
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        if allowed:
            raise InputError(f"input {name!r} holds {bad}; its values must be {allowed}")
        raise InputError(f"input {name!r} holds {bad}, outside this model's range [0, {limit})")
