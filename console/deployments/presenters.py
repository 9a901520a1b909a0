"""Deployments as plain data for the API and pages."""

from __future__ import annotations

from console.catalog.memory import memory_summary
from console.deployments.models import Deployment, Replica


def replica_memory(r: Replica) -> dict:
    """Estimated (as reserved, calibrated), measured and the error between them, for one replica."""
    if not r.reservation:
        return memory_summary(None, None, 0, r.measured_bytes)
    return memory_summary(r.reserved_bytes, r.reservation.get("estimated_bytes"),
                          r.reservation.get("calibrated_from", 0), r.measured_bytes) | {
        "device": r.reservation.get("device")}


def deployment_data(dep: Deployment) -> dict:
    replicas = dep.replica_set.select_related("host").prefetch_related("gpus").order_by("index")
    return {
        "name": dep.name,
        "model": dep.model.name,
        "replica_count": dep.replicas,
        "min_replicas": dep.min_replicas,
        "max_replicas": dep.max_replicas,
        "gpus_per_replica": dep.gpus_per_replica,
        "selector": dep.selector,
        "priority": dep.priority,
        "slo_latency_ms": dep.slo_latency_ms,
        "latency_critical": dep.latency_critical,
        "profile": dep.profile,
        "traffic_rps": dep.traffic_rps,
        "observed_p95_ms": dep.observed_p95_ms,
        "violating": dep.violating,
        "max_batch_size": dep.max_batch_size,
        "max_batch_delay_ms": dep.max_batch_delay_ms,
        "standby": dep.standby,
        "dtype": dep.dtype or dep.model.stored_dtype,
        "batch": dep.batch,
        "seq": dep.seq,
        "estimates": dep.estimates,
        "adapters": [
            {"name": a.name, "path": a.path, "rank": a.rank, "nbytes": a.nbytes, "pinned": a.pinned}
            for a in dep.adapters.all()
        ],
        "state": dep.state,
        "reason": dep.reason,
        "created": dep.created,
        "replicas": [
            {
                "index": r.index,
                "host": r.host.name if r.host else None,
                "gpus": sorted(g.index for g in r.gpus.all()),
                "state": r.observed_state,
                "desired_state": r.desired_state,
                "reserved_bytes": r.reserved_bytes,
                "measured_bytes": r.measured_bytes,
                "memory": replica_memory(r),
                "action": r.action,
                "mps_percentage": r.mps_percentage,
                "adapters": r.adapter_stats,
                "adapter_error": r.adapter_error,
                "endpoint": r.host.endpoint if r.host and r.host.endpoint else None,
                "pid": r.pid,
                "reason": r.reason,
            }
            for r in replicas
        ],
    }
