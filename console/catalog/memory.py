"""Memory estimates for models and deployments, measured loads, and the calibration they feed.

The estimator (agent.artifacts) gives a breakdown from headers and config; each replica's worker
reports what it really used after a warm-up at the same shape; every such load is kept beside
its estimate, and the correction per architecture family and device kind (console.catalog.
calibration) scales what later admissions reserve.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from agent.artifacts import ArtifactError, Estimate, canonical_dtype, estimate
from agent.artifacts.config import read_config
from agent.artifacts.dtypes import WORKER_DTYPES
from agent.engines import for_engine
from agent.protocol import Measurement
from console.bulk import insert
from console.catalog.calibration import NONE, WINDOW, Correction, correction, error_fraction
from console.catalog.models import Calibration, DeviceKind, MemorySample, Model
from console.catalog.services import get_model
from console.deployments.models import Replica
from console.errors import Invalid

log = logging.getLogger("modelgrid.memory")

MAX_BATCH = 4096
MAX_SEQ = 1 << 20
LOGGED_LOADS = 20  # a batch's loads logged a line each; the rest in one line (_log_loads)


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


def _estimate(path: str, dtype: str | None, batch: int, seq: int | None, device: str,
              adapter_pool_bytes: int = 0) -> Estimate:
    """agent.artifacts.estimate under the model roots, an answer up to ESTIMATE_TTL_S old (see _recently). Only
    creating deployments and recording loads use it; registration and the scheduler read the files afresh."""
    return _recently(("estimate", path, dtype, batch, seq, device, adapter_pool_bytes), lambda: estimate(
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
            return _estimate(path, dtype, batch, seq, device, adapter_pool_bytes)
        return estimate(path, dtype=dtype, batch=batch, seq=seq, device=device, adapter_pool_bytes=adapter_pool_bytes,
                        roots=settings.MODEL_ROOTS)
    except ArtifactError as e:
        raise Invalid(str(e), field="path") from None


def estimate_request(path: str | None, model: str | None, dtype: str | None, batch: int, seq: int | None,
                     device: str, adapter_pool_bytes: int = 0, *, calibrate: bool = True,
                     teams: frozenset[int] | None = None) -> dict:
    """The estimate of a path or a registered model (of one of `teams`; None: any), with the calibration later
    admissions would apply (none with calibrate=False, for a console whose database is not set up)."""
    if bool(path) == bool(model):
        raise Invalid("give exactly one of 'path' (a model directory or file) and 'model' (a registered name)",
                      field="path")
    if model:
        path = get_model(model, teams=teams).path
    est = estimate_path(path, dtype, batch, seq, device, adapter_pool_bytes)
    corr = current_correction(est.family, device) if calibrate else NONE
    return est.as_dict() | {"calibrated_bytes": corr.apply(est.total_bytes), "calibration_factor": corr.factor,
                            "calibrated_from": corr.samples}


def check_shape(batch: int, seq: int | None) -> None:
    if not 1 <= batch <= MAX_BATCH:
        raise Invalid(f"batch must be between 1 and {MAX_BATCH}, got {batch}", field="batch")
    if seq is not None and not 1 <= seq <= MAX_SEQ:
        raise Invalid(f"seq must be between 1 and {MAX_SEQ}, got {seq}", field="seq")


def model_positions(model: Model, recent: bool = False) -> int | None:
    """The positions a registered model's config declares (None: no fixed limit, or a vision model); with `recent`,
    an answer up to ESTIMATE_TTL_S old will do (creating deployments)."""
    def read() -> int | None:
        return read_config(Path(model.path) / "config.json", settings.MODEL_ROOTS).positions()

    try:
        return _recently(("positions", model.path), read) if recent else read()
    except ArtifactError as e:
        raise Invalid(str(e), field="model") from None


def serving_dtype(model: Model, dtype: str | None) -> str:
    """The dtype a deployment of `model` serves in: as asked (torch name or short form), else as stored."""
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


def estimates_from(model: Model, deployments) -> dict[int, dict[str, dict]]:
    """Each of `deployments`' breakdowns, by primary key, were it served from `model` (a row as it is about to be
    saved: its files read now); Invalid naming the first deployment that could not be."""
    from console.deployments.capability import check_engine  # deployments depends on catalog
    from console.deployments.services import check_seq

    found = {}
    for dep in deployments:
        try:
            check_seq(model, dep.seq)
            check_engine(model, dep.engine)
            found[dep.pk] = settings_estimates(model, serving_dtype(model, dep.dtype), dep.batch, dep.seq,
                                               dep.adapter_pool_bytes, engine=dep.engine)
        except Invalid as e:
            raise Invalid(f"deployment {dep.name!r} could not be served from it: {e}", field="path") from None
    return found


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


@dataclass(frozen=True)
class Load:
    """A ready worker's measurement, as its agent reported it."""

    host_name: str
    replica_id: int
    measurement: Measurement
    pid: int | None

    @property
    def key(self) -> str:
        # The replica's id is unique across hosts; the host name (up to 200 characters) only helps a reader,
        # so it goes last and is cut to the column.
        return f"{self.replica_id}/{self.pid}/{self.host_name}"[:200]


def record_loads(loads: list[Load]) -> list[MemorySample]:
    """Keep each load's estimate and measurement (once per worker) and recalibrate the families they belong
    to, once each; returns the samples kept. Every status of a ready worker carries its measurement: those
    already kept cost one query for the lot, and a thousand replicas becoming ready at once a handful."""
    kept = set(MemorySample.objects.filter(load_key__in=[ld.key for ld in loads]).values_list("load_key", flat=True))
    new = {ld.key: ld for ld in loads if ld.key not in kept}  # one per worker, the last status's figures
    if not new:
        return []
    replicas = Replica.objects.select_related("deployment__model").in_bulk([ld.replica_id for ld in new.values()])
    by_device: dict[str, dict[str, Correction]] = {}
    samples = []
    for key, ld in new.items():
        replica, m = replicas.get(ld.replica_id), ld.measurement
        if replica is None:
            continue  # deleted meanwhile
        deployment, model = replica.deployment, replica.deployment.model
        try:
            est = for_engine(_estimate(model.path, deployment.dtype or None, m.batch, m.seq, m.device),
                             deployment.engine)
        except ArtifactError as e:
            log.warning("cannot calibrate from %s: its model is no longer readable (%s)", key, e)
            continue
        if m.device not in by_device:
            by_device[m.device] = corrections(m.device)
        before = by_device[m.device].get(est.family, NONE)
        samples.append(MemorySample(
            load_key=key, model=model, deployment=deployment.name, family=est.family,
            architecture=est.architecture, device=m.device, dtype=est.dtype, batch=m.batch, seq=m.seq,
            estimated_bytes=est.total_bytes, calibrated_bytes=before.apply(est.total_bytes),
            measured_bytes=m.total_bytes, estimate=est.as_dict(), measurement=m.model_dump()))
    # A concurrent report of the same load may get there first: its row stands, this one is dropped.
    insert(samples, skip_conflicts=True)
    for family, device in sorted({(sm.family, sm.device) for sm in samples}):
        recalibrate(family, device)
    _log_loads(samples)
    return samples


def _log_loads(samples: list[MemorySample]) -> None:
    """A line each for the first LOGGED_LOADS, then one line for the rest: a rollout of 10,000 replicas has as
    many loads, which the samples keep (and the replicas' events tell) one by one."""
    errors = [100 * (error_fraction(sm.estimated_bytes, sm.measured_bytes) or 0) for sm in samples]
    for sm, err in zip(samples[:LOGGED_LOADS], errors, strict=False):
        log.info("load %s: estimated %d, measured %d bytes (error %+.1f%%)", sm.load_key, sm.estimated_bytes,
                 sm.measured_bytes, err)
    rest = errors[LOGGED_LOADS:]
    if rest:
        log.info("and %d more loads (error: median %+.1f%%, largest %+.1f%%): the memory samples keep each",
                 len(rest), statistics.median(rest), max(rest, key=abs))


def recalibrate(family: str, device: str) -> Correction:
    """Derive the family's correction on `device` from its most recent loads and store it."""
    pairs = MemorySample.objects.filter(family=family, device=device).values_list("estimated_bytes", "measured_bytes")
    corr = correction(pairs[:WINDOW])
    if corr.samples:
        Calibration.objects.update_or_create(family=family, device=device,
                                             defaults={"factor": corr.factor, "samples": corr.samples})
    return corr


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
