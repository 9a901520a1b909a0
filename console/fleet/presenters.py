"""Hosts and GPUs as plain data, for the API and the dashboard alike."""

from __future__ import annotations

from django.db.models import Prefetch, Q

from console.deployments.models import Replica
from console.fleet.labels import gpu_labels
from console.fleet.models import Host


def fleet() -> list[dict]:
    """Every host with its GPUs and the replicas reserved on each GPU, its labels, the room it reports
    for sleeping replicas and the replicas asleep in its memory."""
    asleep = Replica.objects.filter(Q(desired_state="sleeping") | Q(observed_state="sleeping"))
    hosts = Host.objects.prefetch_related(
        "gpus",
        Prefetch("gpus__replicas", queryset=Replica.objects.select_related("deployment").order_by("pk")),
        Prefetch("replicas", queryset=asleep.select_related("deployment").order_by("deployment__name", "index"),
                 to_attr="asleep"),
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
            "labels": h.labels or {},
            "ram_free_bytes": h.ram_free_bytes,
            "asleep": [
                {"deployment": r.deployment.name, "index": r.index, "state": r.observed_state,
                 "desired_state": r.desired_state, "host_bytes": r.host_bytes}
                for r in h.asleep
            ],
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
            "desired_state": r.desired_state,
            "action": r.action,
            "reason": r.reason,
            "mps_percentage": r.mps_percentage,
            "reserved_bytes": r.reserved_bytes,
            "measured_bytes": r.measured_bytes,
            "loaded_bytes": r.loaded_bytes,
            "loading_total_bytes": r.loading_total_bytes,
        }
        for r in g.replicas.all()
    ]
    reserved = sum(r["reserved_bytes"] for r in replicas)
    return {
        "index": g.index,
        "name": g.name,
        "uuid": g.uuid,
        "labels": gpu_labels(g),
        "total_bytes": g.total_bytes,
        "used_bytes": g.used_bytes,
        "free_bytes": g.free_bytes,
        "reserved_bytes": reserved,
        "utilization": g.utilization,
        "simulated": g.simulated,
        "replicas": replicas,
    }
