"""The memory estimate of one replica, term by term: weights, KV cache, activations, runtime overhead.

    total = weights + kv_cache + activations + adapter pool + overhead

* weights: exact bytes from the safetensors headers (every floating tensor converted to the serving
  dtype, integer tensors kept), or from the config's parameter count when there are no weights;
* kv_cache: decoders only, layers x KV heads x head size x 2 x dtype bytes x context x batch,
  sliding-window layers capped at their window (see memory.py);
* activations: the peak transient of one forward at (batch, seq), fused attention assumed for
  the families transformers runs with SDPA (scores never materialised);
* adapter pool: the byte budget a deployment gives its LoRA adapters on the device (0 without);
* overhead: a per-device-kind constant (OVERHEAD_BYTES), since nothing here can measure a runtime.

An architecture without formulas gets header weights plus FALLBACK_MARGIN, said in `notes`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from agent.artifacts.config import DECODER_FAMILIES, ModelConfig
from agent.artifacts.dtypes import (
    FLOATING_SAFETENSORS,
    canonical_dtype,
    compute_dtype,
    stored_dtype,
)
from agent.artifacts.dtypes import dtype_bytes as bytes_of
from agent.artifacts.errors import ArtifactError
from agent.artifacts.files import Roots, kind_of
from agent.artifacts.limits import MAX_ESTIMATE_BYTES
from agent.artifacts.memory import activation_elements, default_seq, kv_cache_elements, logits_elements
from agent.artifacts.model_dir import ModelArtifact, model_path, read_model_dir
from agent.artifacts.params import ParameterCount, count_parameters
from agent.artifacts.safetensors_header import read_safetensors_header

# Runtime allowance per replica, by device kind.
#   cpu: 0. The worker process's own baseline (Python + torch, ~300 MiB RSS) is paid once per
#        worker and is host RAM, not part of what a replica reserves; the CPU allocator returns
#        freed blocks, so there is no caching-allocator slack to reserve either.
#   cuda: 686 MiB, what NVML showed an H100 worker hold beyond torch's allocations (the CUDA context,
#        cuBLAS/cuDNN workspaces). This code never touches a GPU; calibration from worker measurements
#        corrects it per family.
OVERHEAD_BYTES: dict[str, int] = {"cpu": 0, "cuda": 686 * 1024 * 1024}
GIB = 1024 * 1024 * 1024
FALLBACK_MARGIN = 0.2  # unknown architectures: 20% of the weights for activations and caches
# Families that can be served in int8 (weight-only quantised linear layers); others cannot.
INT8_FAMILIES = DECODER_FAMILIES


@dataclass(frozen=True)
class Estimate:
    """Bytes one replica needs, each term separately, and how they were obtained."""

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    adapter_pool_bytes: int
    overhead_bytes: int
    total_bytes: int
    parameters: int
    architecture: str
    family: str
    dtype: str
    batch: int
    seq: int
    device: str
    notes: tuple[str, ...]

    def as_dict(self) -> dict:
        return asdict(self) | {"notes": list(self.notes)}


def estimate(
    source: str | Path | ModelArtifact,
    dtype: str | None = None,
    batch: int = 1,
    seq: int | None = None,
    *,
    device: str = "cuda",
    fused_attention: bool = True,
    adapter_pool_bytes: int = 0,
    roots: Roots = None,
) -> Estimate:
    """Estimate a model directory, a config-only directory, a bare safetensors file or an artifact.

    dtype: the serving dtype (torch names or fp32/fp16/bf16); default the stored dtype, else the
    config's `torch_dtype`, else float32. seq: tokens per sequence (the image side for vision models);
    default min(max positions, 2048). device: "cuda" or "cpu", which picks the overhead constant.
    adapter_pool_bytes: the device-tier budget for LoRA adapters, added as its own term.
    roots: when given, the path and every file read must resolve inside these directories.
    """
    if batch < 1:
        raise ArtifactError(f"batch must be at least 1, got {batch}")
    if seq is not None and seq < 1:
        raise ArtifactError(f"seq must be at least 1, got {seq}")
    if adapter_pool_bytes < 0:
        raise ArtifactError(f"adapter_pool_bytes must not be negative, got {adapter_pool_bytes}")
    if device not in OVERHEAD_BYTES:
        raise ArtifactError(f"device {device!r} is not one of {', '.join(OVERHEAD_BYTES)}")
    if isinstance(source, ModelArtifact):
        artifact = source
    else:
        path = model_path(source, roots, kind="any")  # resolved inside the roots when they are given
        if path.suffix == ".safetensors" and kind_of(path, roots) == "file":
            return _bare_file(path, dtype, batch, seq, device, adapter_pool_bytes, roots)
        directory = path.parent if path.name == "config.json" and kind_of(path, roots) != "dir" else path
        artifact = read_model_dir(directory, require_weights=False, roots=roots)
    cfg = ModelConfig(artifact.config or {"model_type": artifact.model_type}, str(artifact.path / "config.json"))
    notes: list[str] = []

    count: ParameterCount | None = None
    if cfg.family is None:
        notes.append(f"model_type {cfg.model_type!r} has no formulas: header weights + {FALLBACK_MARGIN:.0%} margin")
    else:
        # A field of a known family that is wrong (not merely absent: defaults fill those) is a
        # malformed config, refused with the file and field named, even when the headers could do.
        count = count_parameters(cfg)
        notes += count.notes

    serving = _serving_dtype(dtype, artifact, cfg)
    if serving == "int8" and cfg.family not in INT8_FAMILIES:
        raise ArtifactError(
            f"{cfg.source}: model_type {cfg.model_type!r} cannot be served in int8 "
            "(weight-only int8 is for decoder LMs); use float32, float16 or bfloat16"
        )
    if artifact.tensors:
        # no dtype asked: every tensor as stored (mixed-precision checkpoints stay exact)
        weights = artifact.weights_bytes if dtype is None else _header_weights(artifact, serving, notes)
        parameters = artifact.parameters if count is None else count.parameters
        if count is not None and count.parameters + count.float_buffers + count.int64_buffers != artifact.parameters:
            notes.append(f"config formula counts {count.parameters:,} parameters, the headers hold "
                         f"{artifact.parameters:,} elements: weights taken from the headers")
    elif count is not None:
        weights = (count.parameters + count.float_buffers) * bytes_of(serving) + count.int64_buffers * 8
        parameters = count.parameters
        notes.append("no weights: weight bytes from the config's parameter count")
    else:
        raise ArtifactError(f"{artifact.path}: no *.safetensors weights and no formula for {cfg.model_type!r}")

    act_bytes = bytes_of(compute_dtype(serving))
    if serving == "int8":
        notes.append("int8: floating tensors at 1 byte (quantisation scales not counted); KV cache and "
                     "activations in float16")
    if count is None:
        seq_used = seq or 0
        kv, act = 0, int(weights * FALLBACK_MARGIN)
    else:
        seq_used = seq or default_seq(cfg)
        kv_elems, kv_notes = kv_cache_elements(cfg, batch, seq_used)
        notes += kv_notes
        kv = kv_elems * act_bytes
        act = activation_elements(cfg, batch, seq_used, fused_attention=fused_attention) * act_bytes
        copied = logits_elements(cfg, batch, seq_used) * 4 if act_bytes < 4 else 0
        if copied:
            # The worker hands logits back in float32 (agent.workers.runtime): a copy beside them at the peak.
            act += copied
            notes.append("logits copied to float32 for the answer: counted beside them")
        if fused_attention and cfg.family not in ("t5", "resnet", "mobilenet_v2"):
            notes.append("attention assumed fused (SDPA/flash): scores not materialised")
        if seq is None:
            vision = cfg.family in ("vit", "resnet", "mobilenet_v2")
            what = "image side" if vision else "tokens (min(max positions, 2048))"
            notes.append(f"default shape: batch {batch}, seq {seq_used} {what}")
    overhead = OVERHEAD_BYTES[device]
    if device == "cuda":
        notes.append(f"cuda overhead is a constant {overhead >> 20} MiB (context and workspaces, measured once on an "
                     "H100), not measured here")
    est = Estimate(
        weights_bytes=weights,
        kv_cache_bytes=kv,
        activation_bytes=act,
        adapter_pool_bytes=adapter_pool_bytes,
        overhead_bytes=overhead,
        total_bytes=weights + kv + act + adapter_pool_bytes + overhead,
        parameters=parameters,
        architecture=cfg.architecture,
        family=cfg.family or "unknown",
        dtype=serving,
        batch=batch,
        seq=seq_used,
        device=device,
        notes=tuple(notes),
    )
    _check_bounds(est, cfg.source)
    return est


def _check_bounds(est: Estimate, source: str) -> None:
    """Every count in bounds: each field read from a config is bounded, but their product can still
    describe more than any machine holds, and the console stores these numbers as 64-bit integers."""
    for f in fields(Estimate):
        value = getattr(est, f.name)
        if isinstance(value, int) and value > MAX_ESTIMATE_BYTES:
            raise ArtifactError(
                f"{source}: the estimate's {f.name} is {value:.3e}, beyond any machine "
                f"(at most {MAX_ESTIMATE_BYTES:.3e}): check the config's sizes"
            )


def estimate_model(artifact: ModelArtifact) -> Estimate:
    """Bytes one replica of a registered model reserves on a GPU: stored dtype, batch 1, default seq."""
    return estimate(artifact, device="cuda")


def _serving_dtype(dtype: str | None, artifact: ModelArtifact, cfg: ModelConfig) -> str:
    if dtype is not None:
        return canonical_dtype(dtype)
    if artifact.tensors:
        stored = artifact.stored_dtype
        if stored not in ("float64", "float32", "float16", "bfloat16"):
            raise ArtifactError(f"{artifact.path}: weights are stored as {stored!r}; pass a serving dtype")
        return stored
    declared = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(declared, str):
        try:
            return canonical_dtype(declared)
        except ArtifactError as e:
            raise ArtifactError(f"{cfg.source}: field 'torch_dtype' {declared!r} is not a serving dtype") from e
    return "float32"


def _header_weights(artifact: ModelArtifact, serving: str, notes: list[str]) -> int:
    """Exact bytes: floating tensors at the serving dtype's size, integer tensors as stored."""
    size = bytes_of(serving)
    total = sum(t.numel * size if t.dtype in FLOATING_SAFETENSORS else t.nbytes for t in artifact.tensors)
    if total != artifact.weights_bytes:
        notes.append(f"weights converted from {artifact.stored_dtype} to {serving}")
    return total


def _bare_file(path: Path, dtype: str | None, batch: int, seq: int | None, device: str, adapters: int,
               roots: Roots) -> Estimate:
    """A lone safetensors file: no config, so header weights plus the fallback margin."""
    tensors = tuple(read_safetensors_header(path, roots))
    if not tensors:
        raise ArtifactError(f"{path}: holds no tensors")
    artifact = ModelArtifact(path, "unknown", "unknown", "", stored_dtype(tensors), sum(t.nbytes for t in tensors),
                             sum(t.numel for t in tensors), (path,), {"model_type": "unknown"}, tensors)
    est = estimate(artifact, dtype, batch, seq, device=device, adapter_pool_bytes=adapters)
    return Estimate(**(est.as_dict() | {"notes": ("bare safetensors file: no config.json", *est.notes)}))
