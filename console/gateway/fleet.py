"""The gateway's picture of the fleet: which deployments and adapters exist, and which replicas are ready
where. Read from the database in one go (a snapshot of plain frozen values) and swapped in whole, so the
request path reads memory only and never waits on the database."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from django.conf import settings
from django.utils import timezone

from agent.artifacts import ArtifactError
from agent.artifacts.config import read_config
from agent.engines import AUTO, ENGINES
from console.carried import CarriedRows
from console.catalog.models import Adapter
from console.deployments.models import Deployment, Replica
from console.deployments.serving import serving_state, start_estimate
from console.fleet import lifecycle
from console.fleet.models import AgentCredential, Host
from console.gateway.routes import RouteView, load_routes
from console.scheduler.types import TIER_RANK


@dataclass(frozen=True)
class ReplicaView:
    id: int
    label: str  # "chat#0", as the API and the dashboard name it
    endpoint: str  # the agent's inference base URL
    secret: str  # what that agent's inference port accepts (its host's gateway secret)
    host: str = ""  # its host's name (FleetView.hosts says whether that host is still connected)


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
    engine: str = AUTO  # auto, or an engine's name (agent.engines), as the deployment asks
    team: int = 0  # the owning team's id: only its members' tokens (and admins') may call it
    context: int | None = None  # tokens per sequence its engine takes (prompt and completion), None: unknown
    start_s: float | None = None  # cold: how long a replica of it took to start last (measured); None: not known
    # With a replica ready: how soon another could serve (a sleeping one's wake, else a new one's start, measured),
    # None when none can be added (at max_replicas) or it was never measured. The gateway weighs it against queueing.
    another_s: float | None = None


class HostView(NamedTuple):
    endpoint: str  # the agent's inference base URL ("" until its hello names one)
    secret: str  # what that agent's inference port accepts
    state: str = "connected"  # connected | unknown | offline (Host.lifecycle)
    # Not connected, and its agent unheard for a lease (its lease lapsed, or its link closed and it has not come back
    # within one): requests still waiting for its replicas' answers go elsewhere (failover.py). A link that closes
    # under a live agent (a console restarting) is not that: its agent reconnects, and what it runs carries on.
    lost: bool = False


@dataclass(frozen=True)
class FleetView:
    deployments: dict[str, DeploymentView] = field(default_factory=dict)
    adapters: dict[str, str] = field(default_factory=dict)  # adapter name -> its deployment
    hosts: dict[str, HostView] = field(default_factory=dict)  # by name, for scraping agents' metrics
    loaded: bool = False
    routes: dict[str, RouteView] = field(default_factory=dict)  # public names sent on by weight

    def resolve(self, name: str) -> tuple[DeploymentView, str | None] | None:
        """A model name as clients write it: a deployment, or an adapter's own name (with its deployment)."""
        dep = self.deployments.get(name)
        if dep is not None:
            return dep, None
        owner = self.adapters.get(name)
        if owner is not None and owner in self.deployments:
            return self.deployments[owner], name
        return None


class _Replica(NamedTuple):
    """What the snapshot reads of a replica row (serving_state's fields among them)."""

    deployment_id: int
    pk: int
    index: int
    host_id: int | None
    desired_state: str
    observed_state: str
    start_seconds: float | None
    sleep_wake: dict


# Plain values carried from one snapshot to the next (console/carried.py): the gateway refreshes on every change of
# the fleet and at least every second, and at 10,000 replicas building model instances of every deployment, replica
# and host took 4 s of CPU a snapshot (under the interpreter lock every agent link and request also needs).
_DEPLOYMENTS = CarriedRows(Deployment, ("pk", "name", "priority", "model__task", "standby", "demand_status",
                                        "demand_reason", "created", "slo_latency_ms", "engine", "team_id", "seq",
                                        "model__path", "revision", "max_replicas"), ("name",))
_POSITIONS: dict[tuple[str, int], int | None] = {}  # (model path, revision) -> its config's positions: read once
_POSITIONS_KEPT = 4096
# Where configs declare their context: vLLM reads these (the smallest that is set); the largest bounds both engines.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                 "model_max_length", "max_target_positions")
_REPLICAS = CarriedRows(Replica, _Replica._fields, ("deployment_id", "index"))


def load_fleet() -> FleetView:
    """Read the fleet from the database (sync; the gateway calls it off the event loop)."""
    secrets = {c.host_name: c.gateway_secret for c in AgentCredential.objects.only("host_name", "token_hash")}
    rows = list(Host.objects.only("pk", "name", "endpoint", "connected", "last_seen", "unknown_since", "evicted_at"))
    hosts = {h.pk: (h.endpoint.rstrip("/"), secrets.get(h.name, ""), h.connected, h.name) for h in rows}
    now, lease = timezone.now(), settings.MODELGRID_HOST_LEASE_SECONDS
    by_name = {h.name: HostView(*hosts[h.pk][:2], h.lifecycle, lifecycle.unheard(h.connected, h.last_seen, now, lease))
               for h in rows}
    replicas: dict[int, list[_Replica]] = {}
    for row in _REPLICAS.read():
        replicas.setdefault(row[0], []).append(_Replica(*row))
    names: dict[int, list[str]] = {}
    for dep_id, name in Adapter.objects.order_by("name").values_list("deployment_id", "name"):
        names.setdefault(dep_id, []).append(name)
    deployments, adapters = {}, {}
    for pk, name, tier, task, standby, demand_status, demand_reason, created, slo, engine, team, seq, path, revision, \
            most in _DEPLOYMENTS.read():
        rows = replicas.get(pk, [])
        ready = []
        for r in rows:
            host = hosts.get(r.host_id) if r.host_id is not None else None
            if host is not None and r.desired_state == "ready" and r.observed_state == "ready" and host[2] \
                    and host[0] and not standby:
                ready.append(ReplicaView(r.pk, f"{name}#{r.index}", host[0], host[1], host[3]))
        for a in names.get(pk, ()):
            adapters[a] = name
        deployments[name] = DeploymentView(
            name=name, tier=tier, rank=TIER_RANK.get(tier, len(TIER_RANK)), task=task,
            serving=serving_state(rows, standby, demand_status), ready=tuple(ready), adapters=tuple(names.get(pk, ())),
            demand_status=demand_status, demand_reason=demand_reason, created=int(created.timestamp()),
            slo_latency_ms=slo, engine=engine, team=team, context=_context(engine, seq, path, revision),
            start_s=start_estimate(rows), another_s=_another(rows, len(ready), most) if ready else None)
    return FleetView(deployments, adapters, by_name, loaded=True, routes=load_routes())


def _another(rows: list[_Replica], ready: int, most: int) -> float | None:
    """Seconds until one more replica could serve: the quickest wake of a sleeping one (its last wake measured, else
    its sleep: the same copy the other way), else, below max_replicas, the quickest start measured; None otherwise."""
    wakes = [r.sleep_wake.get("seconds") for r in rows if r.observed_state == "sleeping" and r.sleep_wake]
    if wakes := [w for w in wakes if isinstance(w, int | float) and w >= 0]:
        return min(wakes)
    return start_estimate(rows) if ready < most else None


def _context(engine: str, seq: int | None, path: str, revision: int) -> int | None:
    """The tokens per sequence a deployment's engine takes: its `seq` when set, where the engine caps a sequence at it
    (vLLM's --max-model-len); else, and for the built-in engine, which always takes the model's whole positions, what
    the model's config declares. Read once
    per model path and revision (the gateway's limits bound a request's tokens by it: reservation.py)."""
    if seq and engine in ENGINES and ENGINES[engine].seq_caps_context:
        return seq
    key = (path, revision)
    if key not in _POSITIONS:
        if len(_POSITIONS) >= _POSITIONS_KEPT:
            _POSITIONS.clear()  # a crude bound: one re-read per model afterwards
        try:
            config = read_config(Path(path) / "config.json", settings.MODEL_ROOTS)
            declared = [v for k in _CONTEXT_KEYS if type(v := config.get(k)) is int and v > 0]
            _POSITIONS[key] = max(declared, default=None)
        except ArtifactError:  # not a directory with a config (a bare .safetensors file), or unreadable now
            _POSITIONS[key] = None
    return _POSITIONS[key]
