"""Deployments as plain data for the API and pages."""

from __future__ import annotations

from console.deployments.models import Deployment


def deployment_data(dep: Deployment) -> dict:
    replicas = dep.replica_set.select_related("host").prefetch_related("gpus").order_by("index")
    return {
        "name": dep.name,
        "model": dep.model.name,
        "replica_count": dep.replicas,
        "priority": dep.priority,
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
                "endpoint": r.host.endpoint if r.host and r.host.endpoint else None,
                "pid": r.pid,
                "reason": r.reason,
            }
            for r in replicas
        ],
    }
