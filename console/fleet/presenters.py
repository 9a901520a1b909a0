"""Hosts and GPUs as plain data, for the API and the dashboard alike."""

from __future__ import annotations

from django.db.models import Prefetch

from console.deployments.models import Replica
from console.fleet.models import Host


def fleet() -> list[dict]:
    """Every host with its GPUs and the replicas reserved on each GPU."""
    hosts = Host.objects.prefetch_related(
        "gpus",
        Prefetch("gpus__replicas", queryset=Replica.objects.select_related("deployment").order_by("pk")),
    )
    return [
        {
            "name": h.name,
            "endpoint": h.endpoint,
            "connected": h.connected,
            "last_seen": h.last_seen,
            "agent_version": h.agent_version,
            "generation": h.generation,
            "acked_generation": h.acked_generation,
            "gpus": [_gpu(g) for g in h.gpus.all()],
        }
        for h in hosts
    ]


def _gpu(g) -> dict:
    replicas = [
        {
            "deployment": r.deployment.name,
            "index": r.index,
            "state": r.observed_state,
            "reserved_bytes": r.reserved_bytes,
            "measured_bytes": r.measured_bytes,
        }
        for r in g.replicas.all()
    ]
    reserved = sum(r["reserved_bytes"] for r in replicas)
    return {
        "index": g.index,
        "name": g.name,
        "uuid": g.uuid,
        "total_bytes": g.total_bytes,
        "used_bytes": g.used_bytes,
        "free_bytes": g.free_bytes,
        "reserved_bytes": reserved,
        "utilization": g.utilization,
        "simulated": g.simulated,
        "replicas": replicas,
    }
