"""Apply what agents report to the database. Synchronous; consumers call it through
database_sync_to_async. Agent input only ever updates rows of the agent's own host."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from agent.protocol import Ack, GpuInfo, Hello, HostReport, ReplicaStatus
from console.catalog.memory import record_load
from console.deployments.models import Replica
from console.fleet.models import AgentCredential, Gpu, Host

log = logging.getLogger("modelgrid.fleet")


class Refused(Exception):
    """An agent's message that cannot be accepted; the message says why."""


class RefusedHello(Refused):
    """The agent's hello cannot be accepted; the consumer closes the link."""


def register_hello(credential: AgentCredential, hello: Hello) -> Host:
    if hello.host != credential.host_name:
        raise RefusedHello(
            f"this token is for host {credential.host_name!r}, but the agent says it is {hello.host!r}"
        )
    with transaction.atomic():
        host, _ = Host.objects.update_or_create(
            name=hello.host,
            defaults={
                "endpoint": hello.endpoint,
                "agent_version": hello.agent_version,
                "connected": True,
                "last_seen": timezone.now(),
            },
        )
        _sync_gpus(host, hello.gpus, prune=True)
    return host


def _sync_gpus(host: Host, gpus: list[GpuInfo], prune: bool = False) -> None:
    for info in gpus:
        Gpu.objects.update_or_create(
            host=host,
            index=info.index,
            defaults={
                "uuid": info.uuid,
                "name": info.name,
                "total_bytes": info.total_bytes,
                "used_bytes": info.used_bytes,
                "own_bytes": info.own_bytes,
                "utilization": info.utilization,
                "simulated": info.simulated,
            },
        )
    if prune:
        Gpu.objects.filter(host=host).exclude(index__in=[g.index for g in gpus]).delete()


def apply_report(host: Host, report: HostReport) -> None:
    # An agent speaks only for the deployments it runs: figures for one with no replica on this host are
    # dropped, so no agent token can steer another host's scaling.
    here = set(Replica.objects.filter(host=host).values_list("deployment__name", flat=True).distinct())
    serving = {s.deployment: s.model_dump(exclude={"deployment"}) for s in report.serving if s.deployment in here}
    with transaction.atomic():
        Host.objects.filter(pk=host.pk).update(last_seen=timezone.now(), connected=True, serving=serving,
                                               ram_free_bytes=report.ram_free_bytes)
        _sync_gpus(host, report.gpus)
        for status in report.replicas:
            apply_replica_status(host, status)


def apply_replica_status(host: Host, status: ReplicaStatus) -> None:
    """Record a replica's observed state; statuses for replicas of other hosts are ignored."""
    fields: dict = {"observed_state": status.state, "pid": status.pid}
    if status.measured_bytes is not None:
        fields["measured_bytes"] = status.measured_bytes
    if status.loaded_bytes is not None:
        fields["loaded_bytes"] = status.loaded_bytes
    if status.total_bytes is not None:
        fields["loading_total_bytes"] = status.total_bytes
    fields["host_bytes"] = status.host_bytes
    if status.sleep_wake is not None:
        fields["sleep_wake"] = status.sleep_wake.model_dump()
    fields["adapter_stats"] = [a.model_dump() for a in status.adapters]
    fields["adapter_error"] = status.adapter_error
    if status.reason:
        fields["reason"] = status.reason
    if not Replica.objects.filter(pk=status.replica_id, host=host).update(**fields):
        log.debug("host %s reported unknown replica %s", host.name, status.replica_id)
        return
    if status.state == "ready" and status.measurement is not None:
        record_load(host.name, status.replica_id, status.measurement, status.pid)


def apply_ack(host: Host, ack: Ack) -> None:
    """Record the generation the agent applied. One the console never sent this host is refused (Refused):
    an acknowledged generation it has not reached would make the scheduler treat a desired state as
    applied before the agent ever saw it."""
    sent = Host.objects.filter(pk=host.pk, generation__gte=ack.generation)
    if sent.filter(acked_generation__lt=ack.generation).update(acked_generation=ack.generation) or sent.exists():
        return
    current = Host.objects.filter(pk=host.pk).values_list("generation", flat=True).first()
    raise Refused(f"ack.generation {ack.generation} refused: the console has sent host {host.name!r} "
                  f"generations up to {current}, so an ack may name at most that one")


def mark_disconnected(host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(connected=False)
