"""Measured loads: each ready worker's measurement kept beside its estimate, and the calibration they feed.

Every such load is kept with the estimate made at the same shape; the correction per architecture family and device
kind (console.catalog.calibration) that follows scales what later admissions reserve (console/catalog/memory.py).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from agent.artifacts import ArtifactError
from agent.engines import for_engine
from agent.protocol import Measurement
from console.bulk import insert
from console.catalog.calibration import NONE, WINDOW, Correction, correction, error_fraction
from console.catalog.memory import corrections, recent_estimate
from console.catalog.models import Calibration, MemorySample
from console.deployments.models import Replica

log = logging.getLogger("modelgrid.memory")

LOGGED_LOADS = 20  # a batch's loads logged a line each; the rest in one line (_log_loads)


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
            est = for_engine(recent_estimate(model.path, deployment.dtype or None, m.batch, m.seq, m.device),
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
