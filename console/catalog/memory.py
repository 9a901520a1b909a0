"""Sizing: the memory a model needs at a deployment's settings, and what admission reserves for it.

The estimator (agent.artifacts) gives a breakdown from headers and config; the correction per architecture family and
device kind (console.catalog.calibration, fed by measured loads: console/catalog/loads.py) scales what admissions
reserve. Catalog and deployments both size through here; it imports neither's services.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

import agent.engines as engines
from agent.artifacts import ArtifactError, Estimate, canonical_dtype
from agent.artifacts.config import ModelConfig, read_config
from agent.artifacts.dtypes import WORKER_DTYPES
from agent.artifacts.model_dir import SAFETENSORS
from agent.engines import for_engine
from console.catalog.calibration import NONE, Correction, error_fraction
from console.catalog.models import Calibration, DeviceKind, Model
from console.errors import Invalid

MAX_BATCH = 4096
MAX_SEQ = 1 << 20


ESTIMATE_TTL_S = 10.0
_KEPT = 1024
_kept: dict[tuple, tuple[float, object]] = {}
_kept_lock = threading.Lock()


def _recently(key: tuple, compute):
    """`compute()`, or its answer for `key` from up to ESTIMATE_TTL_S ago: reading a model's files resolves every
    path component safely, and a thousand deployments of one model created in a minute, or a thousand of its
    replicas becoming ready, would read them a thousand times. Errors are not kept."""
    now = time.monotonic()
    kept = _kept.get(key)
    if kept is not None and now - kept[0] < ESTIMATE_TTL_S:
        return kept[1]
    answer = compute()
    with _kept_lock:
        if len(_kept) >= _KEPT:
            _kept.clear()  # a crude bound: one re-read per key afterwards
        _kept[key] = (now, answer)
    return answer


def recent_estimate(path: str, dtype: str | None, batch: int, seq: int | None, device: str,
              adapter_pool_bytes: int = 0) -> Estimate:
    """agent.artifacts.estimate under the model roots, an answer up to ESTIMATE_TTL_S old (see _recently). Only
    creating deployments and recording loads use it; registration and the scheduler read the files afresh."""
    return _recently(("estimate", path, dtype, batch, seq, device, adapter_pool_bytes), lambda: engines.estimate_model(
        path, dtype=dtype, batch=batch, seq=seq, device=device, adapter_pool_bytes=adapter_pool_bytes,
        roots=settings.MODEL_ROOTS))


def estimate_path(
    path: str,
    dtype: str | None = None,
    batch: int = 1,
    seq: int | None = None,
    device: str = DeviceKind.CUDA,
    adapter_pool_bytes: int = 0,
    recent: bool = False,
) -> Estimate:
    """The estimator on a path, with its errors (file and field named) as Invalid (HTTP 422). With `recent`, an
    answer up to ESTIMATE_TTL_S old will do (creating deployments in bulk); else the files are read now."""
    if not path:
        raise Invalid("path is empty: give a model directory, a config.json or a .safetensors file", field="path")
    check_shape(batch, seq)
    try:
        if recent:
            return recent_estimate(path, dtype, batch, seq, device, adapter_pool_bytes)
        return engines.estimate_model(path, dtype=dtype, batch=batch, seq=seq, device=device,
                                      adapter_pool_bytes=adapter_pool_bytes, roots=settings.MODEL_ROOTS)
    except ArtifactError as e:
        raise Invalid(str(e), field="path") from None


def check_shape(batch: int, seq: int | None) -> None:
    if not 1 <= batch <= MAX_BATCH:
        raise Invalid(f"batch must be between 1 and {MAX_BATCH}, got {batch}", field="batch")
    if seq is not None and not 1 <= seq <= MAX_SEQ:
        raise Invalid(f"seq must be between 1 and {MAX_SEQ}, got {seq}", field="seq")


def check_seq(model: Model, seq: int | None) -> None:
    """A sequence length the model can hold: at most its positions (when its config declares them)."""
    if seq is None:
        return  # the model's default shape: nothing to check, nothing to read
    limit = model_positions(model, recent=True)
    if seq is not None and limit is not None and seq > limit:
        raise Invalid(f"seq {seq} is above the {limit} positions model {model.name!r} can hold", field="seq")


def model_positions(model: Model, recent: bool = False) -> int | None:
    """The positions a registered model's config declares (None: no fixed limit, or a vision model); with `recent`,
    an answer up to ESTIMATE_TTL_S old will do (creating deployments)."""
    def read() -> int | None:
        if model_format(model) == SAFETENSORS:
            return read_config(Path(model.path) / "config.json", settings.MODEL_ROOTS).positions()
        return ModelConfig(engines.inspect(model.path, settings.MODEL_ROOTS).config, model.path).positions()

    try:
        return _recently(("positions", model.path), read) if recent else read()
    except ArtifactError as e:
        raise Invalid(str(e), field="model") from None


def model_format(model: Model) -> str:
    """The format of a registered model's files (rows registered before formats were told apart: safetensors)."""
    return (model.shape or {}).get("format") or SAFETENSORS


def serving_dtype(model: Model, dtype: str | None) -> str:
    """The dtype a deployment of `model` serves in: as asked (torch name or short form), else as stored. A model of
    another format serves in the types its file stores (a quantized GGUF file's), and takes no other."""
    if model_format(model) != SAFETENSORS:
        if dtype and dtype.lower() != model.stored_dtype.lower():
            raise Invalid(f"model {model.name!r} is a {model_format(model)} file stored as {model.stored_dtype}: "
                          "it serves in that type (leave dtype empty)", field="dtype")
        return model.stored_dtype
    try:
        name = canonical_dtype(dtype or model.stored_dtype)
    except ArtifactError as e:
        raise Invalid(str(e), field="dtype") from None
    if name not in WORKER_DTYPES:
        raise Invalid(f"dtype {name!r} cannot be served yet; workers load models in {', '.join(WORKER_DTYPES)}",
                      field="dtype")
    return name


def settings_estimates(model: Model, dtype: str, batch: int, seq: int | None,
                       adapter_pool_bytes: int = 0, recent: bool = False, engine: str = "auto") -> dict[str, dict]:
    """The breakdown of one replica at these settings for each device kind, before calibration (with vLLM's own
    memory for a deployment on engine vllm)."""
    check_shape(batch, seq)
    return {
        kind: for_engine(estimate_path(model.path, dtype, batch, seq, kind, adapter_pool_bytes, recent),
                         engine).as_dict()
        for kind in DeviceKind.values
    }


def deployment_estimates(dep) -> dict[str, dict]:
    """A stored deployment's breakdowns, its adapter pool sized for every registered adapter at once."""
    return settings_estimates(dep.model, dep.serving_dtype, dep.batch, dep.seq, dep.adapter_pool_bytes,
                              engine=dep.engine)


def current_correction(family: str, device: str) -> Correction:
    row = Calibration.objects.filter(family=family, device=device).first()
    return Correction(row.factor, row.samples) if row else NONE


def corrections(device: str) -> dict[str, Correction]:
    """Every family's correction on `device`, read once (a scheduler pass needs them all)."""
    return {c.family: Correction(c.factor, c.samples) for c in Calibration.objects.filter(device=device)}


@dataclass(frozen=True)
class Reservation:
    """What admission reserves for one replica on one device kind, and where the figure came from."""

    bytes: int
    estimated_bytes: int  # the estimator's total before calibration
    correction: Correction


def reservation(estimates: dict[str, dict], device: str, by_family: dict[str, Correction]) -> Reservation:
    """The calibrated bytes for a deployment's stored estimate on `device`."""
    est = estimates[device]
    corr = by_family.get(est["family"], NONE)
    return Reservation(corr.apply(est["total_bytes"]), est["total_bytes"], corr)


def memory_summary(reserved: int | None, estimated: int | None, samples: int, measured: int | None) -> dict:
    """The figures people see: "estimated X (calibrated from N loads), measured Y, error Z%"."""
    err = error_fraction(reserved, measured)
    return {
        "estimated_bytes": reserved,
        "uncalibrated_bytes": estimated,
        "calibrated_from": samples,
        "measured_bytes": measured,
        "error_percent": None if err is None else round(100 * err, 1),
    }
