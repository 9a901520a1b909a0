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
from console.catalog.memory import Reservation, deployment_estimates, reservation
from console.catalog.models import DeviceKind
from console.deployments.models import Deployment, DeploymentState, Replica
from console.errors import Invalid
from console.fleet.models import Gpu, Host
from console.scheduler import GpuSlot, ReplicaRequest, plan

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


def _gpu_slots() -> tuple[list[GpuSlot], dict[str, Gpu]]:
    """Schedulable GPUs of connected hosts, with what ModelGrid and others already use on them."""
    gpus = list(
        Gpu.objects.filter(host__connected=True)
        .select_related("host")
        .prefetch_related(Prefetch("replicas", queryset=Replica.objects.only("reserved_bytes", "measured_bytes")))
    )
    slots, by_id = [], {}
    for gpu in gpus:
        replicas = list(gpu.replicas.all())
        reserved = sum(r.reserved_bytes for r in replicas)
        ours = sum(r.measured_bytes or 0 for r in replicas)
        slots.append(
            GpuSlot(
                id=gpu_id(gpu),
                host=gpu.host.name,
                total_bytes=gpu.total_bytes,
                reserved_bytes=reserved,
                # A reading never replaces a reservation; it only reveals memory others hold.
                foreign_bytes=max(gpu.used_bytes - ours, 0),
            )
        )
        by_id[gpu_id(gpu)] = gpu
    return slots, by_id


def fleet_device_kind(gpus: dict[str, Gpu]) -> str:
    """Where replicas will run: "cpu" when every schedulable GPU is simulated (workers then run on the
    host's CPU and measure CPU memory), else "cuda"."""
    return DeviceKind.CPU if gpus and all(g.simulated for g in gpus.values()) else DeviceKind.CUDA


def _reservations(deployments, device: str) -> tuple[dict[int, Reservation], dict[int, str]]:
    """The calibrated bytes one replica of each deployment reserves on `device`, and why any cannot
    be estimated (a model directory that went missing or changed since registration)."""
    needs, problems = {}, {}
    for dep in deployments:
        try:
            if device not in dep.estimates:  # a row from before estimates were stored per deployment
                dep.estimates = deployment_estimates(dep)
                dep.save(update_fields=["estimates"])
            needs[dep.pk] = reservation(dep.estimates, device)
        except Invalid as e:
            problems[dep.pk] = f"cannot estimate its memory: {e}"
    return needs, problems


def _place_pending() -> bool:
    pending = list(Replica.objects.filter(host__isnull=True).select_related("deployment__model"))
    if not pending:
        return False
    slots, gpus = _gpu_slots()
    device = fleet_device_kind(gpus)
    needs, problems = _reservations({r.deployment for r in pending}, device)
    changed = _set_reasons([(r, problems[r.deployment_id]) for r in pending if r.deployment_id in problems])
    pending = [r for r in pending if r.deployment_id in needs]
    requests = [ReplicaRequest(r.deployment.name, r.index, needs[r.deployment_id].bytes) for r in pending]
    result = plan(slots, requests, buffer_bytes=settings.MODELGRID_GPU_BUFFER_BYTES)
    by_key = {(r.deployment.name, r.index): r for r in pending}
    for p in result.placements:
        replica, gpu = by_key[(p.deployment, p.index)], gpus[p.gpu]
        need = needs[replica.deployment_id]
        replica.host = gpu.host
        replica.reserved_bytes = need.bytes
        replica.reservation = {"device": device, "estimated_bytes": need.estimated_bytes,
                               "factor": need.correction.factor, "calibrated_from": need.correction.samples}
        replica.observed_state = "pending"
        replica.reason = p.reason
        replica.save(update_fields=["host", "reserved_bytes", "reservation", "observed_state", "reason"])
        replica.gpus.set([gpu])
        log.info("placed %s#%d on %s: %s", p.deployment, p.index, p.gpu, p.reason)
        changed = True
    changed |= _set_reasons([(by_key[(u.deployment, u.index)], u.reason) for u in result.unplaced])
    return changed


def _set_reasons(replicas: list[tuple[Replica, str]]) -> bool:
    changed = False
    for replica, reason in replicas:
        if replica.reason != reason:
            replica.reason = reason
            replica.save(update_fields=["reason"])
            log.info("cannot place %s#%d: %s", replica.deployment.name, replica.index, reason)
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
            dtype=r.deployment.dtype or r.deployment.model.stored_dtype,
            batch=r.deployment.batch,
            seq=r.deployment.seq,
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
