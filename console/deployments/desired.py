"""Each host's desired state: what the agent there should run, built from the replica rows."""

from __future__ import annotations

import hashlib
import json

from django.db import connection
from django.db.models import Prefetch, Q, prefetch_related_objects

from agent.protocol import DesiredAdapter, DesiredReplica, DesiredState
from console.deployments.models import Deployment, Replica
from console.fleet.models import AgentCredential, Gpu, Host, HostDesired


def desired_by_host(host_ids) -> dict[int, list[DesiredReplica]]:
    """The desired replicas of these hosts, built in a few queries whatever their number. Each deployment is
    read once (not once per replica), and only deployments with adapters read their replicas' adapter use."""
    host_ids = list(host_ids)
    replicas = list(
        Replica.objects.filter(host_id__in=host_ids)
        .only("pk", "host_id", "deployment_id", "reserved_bytes", "desired_state", "mps_percentage")
        .prefetch_related(Prefetch("gpus", queryset=Gpu.objects.only("id", "index")))
        .order_by("pk")
    )
    # Not the estimates and figures a desired state never names: parsing them was two thirds of this read.
    deployments = {d.pk: d for d in Deployment.objects.filter(pk__in={r.deployment_id for r in replicas})
                   .defer("estimates", "gateway_stats", "selector", "model__estimate")
                   .select_related("model").prefetch_related("adapters")}
    with_adapters = [d for d in deployments.values() if d.adapters.all()]
    prefetch_related_objects(with_adapters, Prefetch(  # only what popular_adapters reads
        "replica_set", queryset=Replica.objects.only("deployment_id", "adapter_stats")))
    pools = {pk: _adapter_fields(d) for pk, d in deployments.items()}
    out: dict[int, list[DesiredReplica]] = {host_id: [] for host_id in host_ids}
    for r in replicas:
        out[r.host_id].append(_desired(r, deployments[r.deployment_id], pools[r.deployment_id]))
    return out


def desired_replicas(host: Host) -> list[DesiredReplica]:
    return desired_by_host([host.pk])[host.pk]


def _adapter_fields(dep) -> dict:
    adapters = list(dep.adapters.all())
    pool = dep.adapter_pool_bytes
    return {
        "adapters": [DesiredAdapter(name=a.name, path=a.path, pinned=a.pinned) for a in adapters],
        "adapter_pool_bytes": pool,
        "adapter_host_bytes": 4 * pool,
        "adapter_hints": popular_adapters(dep, pool) if adapters else {},
    }


def _desired(r: Replica, dep: Deployment, adapter_fields: dict) -> DesiredReplica:
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


def gateway_secret(host: Host) -> str:
    """The secret the host's agent's inference port accepts (only the console's gateway knows it); read afresh,
    so a rotated token's secret is what the next push carries."""
    credential = AgentCredential.objects.filter(host_name=host.name).first()
    return credential.gateway_secret if credential is not None else ""


def desired_state(host: Host) -> DesiredState:
    """The desired state a host was last given (stored at its generation by the scheduler pass), with the
    secret its agent's inference port accepts."""
    row = Host.objects.filter(pk=host.pk).values("generation", "desired_digest", "desired__replicas").first()
    secret = gateway_secret(host)
    if row is None or not row["desired_digest"] or row["desired__replicas"] is None:
        # Marked stale, or never stored: built now (the next pass stores it under a new generation).
        return DesiredState(generation=row["generation"] if row else 0, gateway_secret=secret,
                            replicas=desired_replicas(host))
    return DesiredState(generation=row["generation"], gateway_secret=secret,
                        replicas=[DesiredReplica.model_validate(r) for r in row["desired__replicas"]])


def mark_stale(deployment) -> None:
    """A deployment's spec changed (its settings, its adapters, its deletion): the hosts running it get their
    desired state rebuilt by the next pass, which otherwise rebuilds only hosts whose replicas it moved."""
    Host.objects.filter(replicas__deployment=deployment).update(desired_digest="")


def bump_generations(host_ids=None) -> dict[int, tuple[int, list[dict]]]:
    """Rebuild the desired state of these hosts (None: every host, plus any marked stale) and give each whose
    state changed a new generation, storing what is pushed; returns, per host that got one, its generation and
    its desired replicas as stored (the push sends them without reading them back)."""
    hosts = Host.objects.all() if host_ids is None else Host.objects.filter(Q(pk__in=list(host_ids)) |
                                                                             Q(desired_digest=""))
    hosts = list(hosts.only("pk", "generation", "desired_digest").order_by("pk"))  # by key, as intake locks hosts
    built = desired_by_host([h.pk for h in hosts])
    bumps = []  # (host, its new digest, its replicas)
    for host in hosts:
        replicas = [r.model_dump(mode="json") for r in built[host.pk]]
        digest = hashlib.sha256(json.dumps(replicas, sort_keys=True).encode()).hexdigest()
        if digest != host.desired_digest:
            bumps.append((host, digest, replicas))
    if not bumps:
        return {}
    # Conditional updates (a concurrent pass that already bumped a host wins), pipelined: these host rows stay
    # locked until the pass commits, and intake's leases and acks wait for them, so they are written last and
    # fast (an UPDATE per host through the ORM held 1,000 hosts' acks for over a second).
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {q(Host._meta.db_table)} SET {q('desired_digest')} = %s, {q('generation')} = %s "
                           f"WHERE {q('id')} = %s AND {q('desired_digest')} = %s",
                           [(digest, host.generation + 1, host.pk, host.desired_digest) for host, digest, _ in bumps])
    written = set(Host.objects.filter(pk__in=[host.pk for host, _, _ in bumps])
              .values_list("pk", "desired_digest", "generation"))
    changed: dict[int, tuple[int, list[dict]]] = {}
    stored = []
    for host, digest, replicas in bumps:
        if (host.pk, digest, host.generation + 1) in written:  # ours
            changed[host.pk] = (host.generation + 1, replicas)
            stored.append(HostDesired(host_id=host.pk, replicas=replicas))
    if stored:
        HostDesired.objects.bulk_create(stored, update_conflicts=True, unique_fields=["host"],
                                        update_fields=["replicas"])
    return changed
