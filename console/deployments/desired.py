"""Each host's desired state: what the agent there should run, built from the replica rows."""

from __future__ import annotations

import hashlib

from django.db.models import Prefetch

from agent.protocol import DesiredAdapter, DesiredReplica, DesiredState
from console.deployments.models import Replica
from console.fleet.models import AgentCredential, Host


def desired_replicas(host: Host) -> list[DesiredReplica]:
    replicas = (
        Replica.objects.filter(host=host)
        .select_related("deployment__model")
        .prefetch_related("gpus", "deployment__adapters", Prefetch(  # only what popular_adapters reads
            "deployment__replica_set", queryset=Replica.objects.only("deployment_id", "adapter_stats")))
        .order_by("pk")
    )
    pools: dict[int, dict] = {}  # per deployment, once: its replicas share the same adapter fields
    out = []
    for r in replicas:
        if r.deployment_id not in pools:
            pools[r.deployment_id] = _adapter_fields(r.deployment)
        out.append(_desired(r, pools[r.deployment_id]))
    return out


def _adapter_fields(dep) -> dict:
    adapters = list(dep.adapters.all())
    pool = dep.adapter_pool_bytes
    return {
        "adapters": [DesiredAdapter(name=a.name, path=a.path, pinned=a.pinned) for a in adapters],
        "adapter_pool_bytes": pool,
        "adapter_host_bytes": 4 * pool,
        "adapter_hints": popular_adapters(dep, pool),
    }


def _desired(r: Replica, adapter_fields: dict) -> DesiredReplica:
    dep = r.deployment
    return DesiredReplica(
        id=r.pk,
        deployment=dep.name,
        model_path=dep.model.path,
        architecture=dep.model.architecture,
        gpus=sorted(g.index for g in r.gpus.all()),
        reserved_bytes=r.reserved_bytes,
        state=r.desired_state,
        dtype=dep.serving_dtype,
        batch=dep.batch,
        seq=dep.seq,
        mps_percentage=r.mps_percentage,
        max_batch_size=dep.max_batch_size,
        max_batch_delay_ms=dep.max_batch_delay_ms,
        **adapter_fields,
    )


def popular_adapters(dep, pool_bytes: int) -> dict[str, float]:
    """The adapters most requested across the deployment's replicas, as many as its device tier holds:
    a replica that starts (or a pool that evicted them) prefetches these first. Only the set is sent,
    not the counts, so the desired state changes when the favourites change, not with every request."""
    requests: dict[str, int] = {}
    for replica in dep.replica_set.all():
        for stat in replica.adapter_stats or ():
            requests[stat["name"]] = requests.get(stat["name"], 0) + stat.get("requests", 0)
    sizes = {a.name: a.nbytes for a in dep.adapters.all()}
    hints, room = {}, pool_bytes
    for name in sorted((n for n in requests if n in sizes and requests[n]), key=lambda n: (-requests[n], n)):
        if sizes[name] <= room:
            hints[name], room = 1.0, room - sizes[name]
    return hints


def desired_state(host: Host) -> DesiredState:
    """The full desired state of a host at its current generation, with the secret its agent's inference
    port accepts (only the console's gateway knows it)."""
    credential = AgentCredential.objects.filter(host_name=host.name).first()
    secret = credential.gateway_secret if credential is not None else ""
    return DesiredState(generation=host.generation, replicas=desired_replicas(host), gateway_secret=secret)


def bump_generations() -> tuple[int, ...]:
    """Give each host whose desired state changed a new generation; returns their ids."""
    changed = []
    for host in Host.objects.all():
        body = "".join(r.model_dump_json() for r in desired_replicas(host))
        digest = hashlib.sha256(body.encode()).hexdigest()
        if digest != host.desired_digest:
            # Conditional update: a concurrent pass that already bumped this host wins.
            updated = Host.objects.filter(pk=host.pk, desired_digest=host.desired_digest).update(
                desired_digest=digest, generation=host.generation + 1
            )
            if updated:
                changed.append(host.pk)
    return tuple(changed)
