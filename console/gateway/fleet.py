"""The gateway's picture of the fleet: which deployments and adapters exist, and which replicas are ready
where. Read from the database in one go (a snapshot of plain frozen values) and swapped in whole, so the
request path reads memory only and never waits on the database."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Prefetch

from console.deployments.models import Deployment, Replica
from console.deployments.serving import serving_state
from console.fleet.models import AgentCredential
from console.scheduler.types import TIER_RANK


@dataclass(frozen=True)
class ReplicaView:
    id: int
    label: str  # "chat#0", as the API and the dashboard name it
    endpoint: str  # the agent's inference base URL
    secret: str  # what that agent's inference port accepts (its host's gateway secret)


@dataclass(frozen=True)
class DeploymentView:
    name: str
    tier: str
    rank: int  # 0 is the most important tier
    task: str
    serving: str  # ready | waking | asleep | cold | standby
    ready: tuple[ReplicaView, ...]  # replicas that take requests now
    adapters: tuple[str, ...]
    demand_status: str = ""  # the scheduler's answer to waiting requests: served | waiting | refused
    demand_reason: str = ""
    created: int = 0
    slo_latency_ms: int | None = None  # its p95 latency target


@dataclass(frozen=True)
class FleetView:
    deployments: dict[str, DeploymentView] = field(default_factory=dict)
    adapters: dict[str, str] = field(default_factory=dict)  # adapter name -> its deployment
    loaded: bool = False

    def resolve(self, name: str) -> tuple[DeploymentView, str | None] | None:
        """A model name as clients write it: a deployment, or an adapter's own name (with its deployment)."""
        dep = self.deployments.get(name)
        if dep is not None:
            return dep, None
        owner = self.adapters.get(name)
        if owner is not None and owner in self.deployments:
            return self.deployments[owner], name
        return None


def load_fleet() -> FleetView:
    """Read the fleet from the database (sync; the gateway calls it off the event loop)."""
    secrets = {c.host_name: c.gateway_secret for c in AgentCredential.objects.all()}
    rows = Deployment.objects.select_related("model").prefetch_related(
        "adapters", Prefetch("replica_set", queryset=Replica.objects.select_related("host")))
    deployments, adapters = {}, {}
    for dep in rows:
        replicas = list(dep.replica_set.all())
        ready = tuple(
            ReplicaView(r.pk, f"{dep.name}#{r.index}", r.host.endpoint.rstrip("/"), secrets.get(r.host.name, ""))
            for r in replicas
            if r.host is not None and r.desired_state == "ready" and r.observed_state == "ready"
            and r.host.connected and r.host.endpoint and not dep.standby
        )
        names = tuple(sorted(a.name for a in dep.adapters.all()))
        for a in names:
            adapters[a] = dep.name
        deployments[dep.name] = DeploymentView(
            name=dep.name, tier=dep.priority, rank=TIER_RANK.get(dep.priority, len(TIER_RANK)),
            task=dep.model.task, serving=serving_state(replicas, dep.standby), ready=ready, adapters=names,
            demand_status=dep.demand_status, demand_reason=dep.demand_reason, created=int(dep.created.timestamp()),
            slo_latency_ms=dep.slo_latency_ms)
    return FleetView(deployments, adapters, loaded=True)
