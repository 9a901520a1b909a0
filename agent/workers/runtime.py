"""Load a model and run forward passes. Imported only inside worker processes: it imports torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel  # PreTrainedModel: see LoadedModel

from agent.artifacts import inspect_model_dir
from agent.workers.spec import DTYPES, SIGNATURES, WorkerSpec


class InputError(ValueError):
    """A request the model cannot take; the message names the tensor and the problem."""


class LoadedModel:
    """A model in eval mode on its device, answering one batch at a time."""

    # Importing PreTrainedModel above (transformers.modeling_utils) is what the first from_pretrained
    # would otherwise do, 2 s and more: a warm spare worker (agent.workers.spares) thus pays it early.

    def __init__(self, spec: WorkerSpec, model: PreTrainedModel, device: torch.device) -> None:
        self.spec = spec
        self.model = model
        self.device = device
        self.signature = SIGNATURES[spec.task]
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.type_vocab_size = int(getattr(config, "type_vocab_size", 0) or 0)
        # Encoders have learned absolute positions: a longer sequence would index past the table.
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 0) if spec.task == "encoder" else 0
        self.output_dim = self.vocab_size if spec.task == "causal-lm" else int(config.hidden_size)

    def describe(self) -> dict[str, int]:
        """Facts the daemon shows in model metadata."""
        return {"output_dim": self.output_dim, "vocab_size": self.vocab_size, "max_positions": self.max_positions}

    def measure_bytes(self) -> int:
        """Bytes this replica holds on its device, after a warm-up forward (see the comments)."""
        self.infer({"input_ids": np.zeros((1, 4), dtype=np.int64)})
        if self.device.type == "cuda":
            # What the caching allocator holds after a warm-up (weights, buffers, workspaces, freed
            # activation blocks it keeps) is what this replica takes from the GPU. The CUDA context
            # itself (a few hundred MiB) is outside the allocator and not counted here.
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.memory_reserved(self.device))
        # On the CPU there is no allocator to ask: count parameter and buffer bytes, the part that
        # stays resident; activations come and go with each request.
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        buffers = sum(b.numel() * b.element_size() for b in self.model.buffers())
        return int(params + buffers)

    @torch.inference_mode()
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One forward pass over a batch of token ids; returns the task's output tensor as float32."""
        tensors = self._check(inputs)
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
        _check_range("input_ids", ids, self.vocab_size)
        if self.max_positions and ids.shape[1] > self.max_positions:
            raise InputError(
                f"input 'input_ids' has {ids.shape[1]} tokens; this model takes at most {self.max_positions}"
            )
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
        if self.spec.task == "encoder" and "attention_mask" not in tensors:
            tensors["attention_mask"] = np.ones_like(ids)
        return {name: torch.from_numpy(value).to(self.device) for name, value in tensors.items()}


def mean_pool_normalize(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings as sentence-transformers makes them: mean over unmasked tokens, then L2 norm."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return F.normalize((summed / counts).float(), p=2, dim=1)


def load(spec: WorkerSpec) -> LoadedModel:
    """Load the model directory from safetensors only, in eval mode on the spec's device."""
    if spec.task not in SIGNATURES:
        raise ValueError(f"task {spec.task!r} is not servable (causal-lm or encoder)")
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype {spec.dtype!r} is not supported ({', '.join(DTYPES)})")
    # Checked first, torch-free, for a message that names the file; transformers would otherwise
    # take a missing directory for a Hub repository id.
    artifact = inspect_model_dir(spec.model_path)
    if artifact.task != spec.task:
        raise ValueError(f"{spec.model_path} is a {artifact.task} model ({artifact.architecture}), not {spec.task}")
    device = torch.device(spec.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{spec.device} asked for, but this worker's torch {torch.__version__} sees no CUDA GPU")
        torch.cuda.set_device(device)
    model_class = AutoModelForCausalLM if spec.task == "causal-lm" else AutoModel
    model = model_class.from_pretrained(
        spec.model_path, use_safetensors=True, local_files_only=True, dtype=getattr(torch, spec.dtype)
    )
    model.to(device).eval()
    return LoadedModel(spec, model, device)


def _int_matrix(name: str, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"input {name!r} must be a non-empty [batch, sequence] matrix, got shape {list(array.shape)}")
    if not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"input {name!r} must hold integers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _check_range(name: str, array: np.ndarray, limit: int) -> None:
    # An id past the embedding table is an IndexError on the CPU but a device-side assert that
    # poisons the whole CUDA context on a GPU, so it is refused before the forward pass.
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise InputError(f"input {name!r} holds {bad}, outside this model's range [0, {limit})")
