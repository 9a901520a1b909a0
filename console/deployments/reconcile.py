"""One pass of the control loop: derive replicas from deployments, place the pending ones with
the pure scheduler, and compute each host's desired state. Level-triggered: every pass looks at
the whole database, so a missed pass or a lost message is repaired by the next one."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from agent.protocol import DesiredReplica, DesiredState
from console.deployments.models import Deployment, DeploymentState, Replica
from console.fleet.models import Gpu, Host
from console.scheduler import Deployment as DeploymentSpec
from console.scheduler import Gpu as GpuSpec
from console.scheduler import PlanInput, Settings, plan
from console.scheduler import Replica as ReplicaSpec

log = logging.getLogger("modelgrid.scheduler")


@dataclass(frozen=True)
class PassResult:
    changed_hosts: tuple[int, ...]  # host ids whose desired state got a new generation
    changed: bool  # anything at all changed (replicas created, placed, states)


def gpu_id(gpu: Gpu) -> str:
    return f"{gpu.host.name}/{gpu.index}"


def _sync_replica_rows() -> bool:
    """Make the replica rows of each deployment match its replica count."""
    changed = False
    for dep in Deployment.objects.prefetch_related("replica_set"):
        rows = sorted(dep.replica_set.all(), key=lambda r: r.index)
        if len(rows) < dep.replicas:
            have = {r.index for r in rows}
            missing = [i for i in range(dep.replicas + len(rows)) if i not in have][: dep.replicas - len(rows)]
            Replica.objects.bulk_create([Replica(deployment=dep, index=i) for i in missing])
            changed = True
        elif len(rows) > dep.replicas:
            Replica.objects.filter(pk__in=[r.pk for r in rows[dep.replicas:]]).delete()
            changed = True
    return changed


def _gpu_specs() -> tuple[list[GpuSpec], dict[str, Gpu]]:
    """Schedulable GPUs of connected hosts, with the memory other processes use on them."""
    gpus = list(
        Gpu.objects.filter(host__connected=True)
        .select_related("host")
        .prefetch_related(Prefetch("replicas", queryset=Replica.objects.only("reserved_bytes", "measured_bytes")))
    )
    specs, by_id = [], {}
    for gpu in gpus:
        ours = sum(r.measured_bytes or 0 for r in gpu.replicas.all())
        # A reading never replaces a reservation; it only reveals memory others hold.
        specs.append(GpuSpec(id=gpu_id(gpu), host=gpu.host.name, total_bytes=gpu.total_bytes,
                             used_bytes=max(gpu.used_bytes - ours, 0)))
        by_id[gpu_id(gpu)] = gpu
    return specs, by_id


def _place_pending() -> bool:
    """Place replica rows without a host, keeping every placed one where it is (no moves, no preemption yet)."""
    pending = list(Replica.objects.filter(host__isnull=True).select_related("deployment__model"))
    if not pending:
        return False
    specs, gpus = _gpu_specs()
    placed = [r for r in Replica.objects.filter(host__isnull=False).select_related("deployment__model")
              .prefetch_related("gpus__host") if r.gpus.all() and all(gpu_id(g) in gpus for g in r.gpus.all())]
    by_dep: dict[str, list[Replica]] = {}
    for r in pending:
        by_dep.setdefault(r.deployment.name, []).append(r)
    deployments, counts = {}, {}
    for r in pending + placed:
        deployments[r.deployment.name] = r.deployment
        counts[r.deployment.name] = counts.get(r.deployment.name, 0) + 1
    request = PlanInput(
        gpus=tuple(specs),
        deployments=tuple(DeploymentSpec(name=name, bytes=dep.model.estimate_bytes, replicas=counts[name],
                                         priority=dep.priority) for name, dep in deployments.items()),
        replicas=tuple(ReplicaSpec(r.deployment.name, r.index, tuple(gpu_id(g) for g in r.gpus.all()),
                                   r.reserved_bytes) for r in placed),
        buffer_bytes=settings.MODELGRID_GPU_BUFFER_BYTES,
        settings=Settings(max_moves=0, preempt=False, search_budget_s=0.2),
    )
    result = plan(request)
    # New replicas of the plan map, in index order, onto the pending rows of their deployment.
    fresh: dict[str, list] = {}
    for p in result.replicas:
        if p.action in ("place", "refuse"):
            fresh.setdefault(p.deployment, []).append(p)
    changed = False
    for name, rows in by_dep.items():
        for replica, p in zip(sorted(rows, key=lambda r: r.index), fresh.get(name, []), strict=False):
            if p.action == "place":
                replica.host = gpus[p.gpus[0]].host
                replica.reserved_bytes = p.reserved_bytes
                replica.observed_state = "pending"
                replica.reason = p.reason
                replica.save(update_fields=["host", "reserved_bytes", "observed_state", "reason"])
                replica.gpus.set([gpus[g] for g in p.gpus])
                log.info("placed %s#%d on %s: %s", name, replica.index, ",".join(p.gpus), p.reason)
                changed = True
            elif replica.reason != p.reason:
                replica.reason = p.reason
                replica.save(update_fields=["reason"])
                log.info("cannot place %s#%d: %s", name, replica.index, p.reason)
                changed = True
    return changed


def derive_state(replicas: list[Replica]) -> tuple[str, str]:
    """A deployment's state and reason, from its replicas."""
    if not replicas:
        return DeploymentState.PENDING, "waiting for the scheduler"
    unplaced = [r for r in replicas if r.host_id is None]
    if unplaced and unplaced[0].reason:
        if len(unplaced) == len(replicas):
            return DeploymentState.UNSCHEDULABLE, unplaced[0].reason
        return DeploymentState.DEGRADED, f"{len(unplaced)} of {len(replicas)} replicas unplaced: {unplaced[0].reason}"
    states = [r.observed_state for r in replicas]
    failed = [r for r in replicas if r.observed_state == "failed"]
    if failed:
        return DeploymentState.FAILED, f"replica {failed[0].index} failed: {failed[0].reason}"
    if all(s == "ready" for s in states):
        return DeploymentState.READY, ""
    if "loading" in states:
        return DeploymentState.LOADING, "loading weights"
    return DeploymentState.PENDING, "waiting for an agent to start the replica"


def _refresh_deployment_states() -> bool:
    changed = False
    for dep in Deployment.objects.prefetch_related("replica_set"):
        state, reason = derive_state(list(dep.replica_set.all()))
        if (dep.state, dep.reason) != (state, reason):
            dep.state, dep.reason = state, reason
            dep.save(update_fields=["state", "reason"])
            changed = True
    return changed


def desired_replicas(host: Host) -> list[DesiredReplica]:
    replicas = (
        Replica.objects.filter(host=host)
        .select_related("deployment__model")
        .prefetch_related("gpus")
        .order_by("pk")
    )
    return [
        DesiredReplica(
            id=r.pk,
            deployment=r.deployment.name,
            model_path=r.deployment.model.path,
            architecture=r.deployment.model.architecture,
            gpus=sorted(g.index for g in r.gpus.all()),
            reserved_bytes=r.reserved_bytes,
            state=r.desired_state,
        )
        for r in replicas
    ]


def desired_state(host: Host) -> DesiredState:
    """The full desired state of a host at its current generation."""
    return DesiredState(generation=host.generation, replicas=desired_replicas(host))


def _bump_generations() -> tuple[int, ...]:
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


def _expire_silent_hosts() -> bool:
    """A host whose agent stopped reporting is offline: it gets no new replicas."""
    cutoff = timezone.now() - timedelta(seconds=settings.MODELGRID_HOST_STALE_SECONDS)
    return bool(Host.objects.filter(connected=True, last_seen__lt=cutoff).update(connected=False))


def reconcile_once() -> PassResult:
    """One pass, committed in one transaction."""
    with transaction.atomic():
        changed = _expire_silent_hosts()
        changed |= _sync_replica_rows()
        changed |= _place_pending()
        changed |= _refresh_deployment_states()
        hosts = _bump_generations()
    return PassResult(changed_hosts=hosts, changed=changed or bool(hosts))
