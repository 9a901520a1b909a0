"""Serving dtypes as torch names them, and their size in bytes.

Kept apart from the safetensors dtype table: that one names what a file *stores* ("BF16"),
this one names what an operator asks a replica to *serve* in ("bfloat16", "bf16").
"""

from __future__ import annotations

from agent.artifacts.errors import ArtifactError

# Floating dtypes a model can be served in; weights are converted to these on load.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,  # weight-only quantised serving; activations stay in the compute dtype
}
ALIASES: dict[str, str] = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}
# What a worker can load a model in today; the estimator knows more (int8) than the worker serves.
WORKER_DTYPES = ("float32", "float16", "bfloat16")
# safetensors header dtype -> its name (as torch names it), for the floating dtypes a stored model can be read as.
SAFETENSORS_DTYPE_NAMES: dict[str, str] = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
FLOATING_SAFETENSORS = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


def canonical_dtype(name: str) -> str:
    """The torch name for `name` (short forms and a `torch.` prefix accepted); ArtifactError if unknown."""
    key = name.strip().lower().removeprefix("torch.")
    key = ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        known = ", ".join([*DTYPE_BYTES, *ALIASES])
        raise ArtifactError(f"dtype {name!r} is not one ModelGrid can serve in (known: {known})")
    return key


def dtype_bytes(name: str) -> int:
    """Bytes per element of the serving dtype `name`."""
    return DTYPE_BYTES[canonical_dtype(name)]


def compute_dtype(name: str) -> str:
    """The dtype activations and the KV cache are held in: int8 weights still compute in float16."""
    name = canonical_dtype(name)
    return "float16" if name == "int8" else name


def stored_dtype(tensors) -> str:
    """The torch name of the dtype holding most of the bytes of `tensors` (TensorInfo-like)."""
    by_dtype: dict[str, int] = {}
    for t in tensors:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    stored = max(by_dtype, key=by_dtype.get)
    return SAFETENSORS_DTYPE_NAMES.get(stored, stored.lower())
