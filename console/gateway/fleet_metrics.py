"""What /metrics shows of the database: hosts by lifecycle, desired-state generations not yet acknowledged,
each deployment's tier, state, SLO target and observed p95, and usage per team, token and deployment
(console/usage/metrics.py).

Read afresh for every scrape in a few queries whatever the fleet's size, and rendered from that snapshot (no
labelled gauges kept between scrapes: a deleted deployment or host leaves no series behind). The same in every
console process, so any of them can be scraped."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric

from console.deployments.models import Deployment, Replica
from console.fleet import lifecycle
from console.fleet.models import Host
from console.gateway.metrics import SLO_OBJECTIVE, ConsoleMetrics
from console.usage.metrics import UsageCollector, read_usage_totals

log = logging.getLogger("modelgrid.gateway")
LIFECYCLES = lifecycle.STATES


@dataclass(frozen=True)
class HostFigures:
    name: str
    lifecycle: str  # connected | unknown | offline
    behind: int  # generations pushed but not acknowledged (0 unless connected)


@dataclass(frozen=True)
class DeploymentFigures:
    name: str
    tier: str
    state: str
    slo_ms: int | None
    p95_ms: float | None  # what the scheduler last observed (the gateway's window, else the agents')
    violating: bool
    replicas: dict[str, int] = field(default_factory=dict)  # observed state -> replicas in it


@dataclass(frozen=True)
class FleetFigures:
    hosts: tuple[HostFigures, ...]
    deployments: tuple[DeploymentFigures, ...]


def read_fleet_figures() -> FleetFigures:
    """The fleet's figures as the database has them now (sync, DB)."""
    hosts = tuple(
        HostFigures(h.name, h.lifecycle, max(h.generation - h.acked_generation, 0) if h.connected else 0)
        for h in Host.objects.only("name", "connected", "unknown_since", "evicted_at", "generation",
                                   "acked_generation").order_by("name"))
    counts: dict[int, dict[str, int]] = {}
    for dep_id, state, n in (Replica.objects.order_by().values("deployment_id", "observed_state")
                             .annotate(n=Count("pk")).values_list("deployment_id", "observed_state", "n")):
        counts.setdefault(dep_id, {})[state] = n
    deployments = tuple(
        DeploymentFigures(name, tier, state, slo, p95, violating, counts.get(pk, {}))
        for pk, name, tier, state, slo, p95, violating in Deployment.objects.order_by("name").values_list(
            "pk", "name", "priority", "state", "slo_latency_ms", "observed_p95_ms", "violating"))
    return FleetFigures(hosts, deployments)


class FleetCollector:
    """One scrape's fleet families, from `figures` (None: the database could not be read)."""

    def __init__(self, figures: FleetFigures | None) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("modelgrid_console_database_up", "1 when this scrape read the fleet's figures from "
                               "the database; 0 when it could not (the fleet's series are then left out)")
        up.add_metric([], 0 if self.figures is None else 1)
        yield up
        if self.figures is not None:
            yield from _host_families(self.figures.hosts)
            yield from _deployment_families(self.figures.deployments)


def scrape(metrics: ConsoleMetrics, usage: bool = True) -> bytes:
    """The whole /metrics body: this process's series and the fleet's, read now (sync, DB: run off the loop); with
    `usage`, every team's usage per token (for admins: it names other teams' people's tokens)."""
    try:
        figures = read_fleet_figures()
        usage = read_usage_totals() if usage else None
    except Exception:  # the process's own series are worth having while the database is away
        log.exception("metrics: cannot read the fleet's figures")
        figures = usage = None
    return metrics.render(FleetCollector(figures), UsageCollector(usage))


def _host_families(hosts: tuple[HostFigures, ...]) -> Iterator[Metric]:
    by_state = GaugeMetricFamily("modelgrid_hosts", "Hosts by lifecycle: connected; unknown (lease lapsed, replicas "
                                 "kept); offline (evicted, replicas re-placed)", labels=["state"])
    each = GaugeMetricFamily("modelgrid_host_lifecycle", "1 for the lifecycle state each host is in, 0 for the "
                             "others", labels=["host", "state"])
    behind = GaugeMetricFamily("modelgrid_desired_state_hosts_behind", "Connected hosts that have not acknowledged "
                               "their current desired-state generation")
    generations = GaugeMetricFamily("modelgrid_desired_state_generations_behind", "Sum over connected hosts of "
                                    "generation pushed minus generation acknowledged")
    totals = dict.fromkeys(LIFECYCLES, 0)
    for h in hosts:
        totals[h.lifecycle] = totals.get(h.lifecycle, 0) + 1
        for state in LIFECYCLES:
            each.add_metric([h.name, state], 1 if state == h.lifecycle else 0)
    for state, n in totals.items():
        by_state.add_metric([state], n)
    behind.add_metric([], sum(1 for h in hosts if h.behind))
    generations.add_metric([], sum(h.behind for h in hosts))
    yield from (by_state, each, behind, generations)


def _deployment_families(deployments: tuple[DeploymentFigures, ...]) -> Iterator[Metric]:
    one = ["deployment"]
    info = GaugeMetricFamily("modelgrid_deployment_info", "1 for each deployment, with its tier and state",
                             labels=["deployment", "tier", "state"])
    replicas = GaugeMetricFamily("modelgrid_deployment_replicas", "A deployment's replicas by the state their "
                                 "agent reports", labels=["deployment", "state"])
    target = GaugeMetricFamily("modelgrid_deployment_slo_latency_seconds", "The deployment's p95 latency target "
                               "(slo_latency_ms)", labels=one)
    objective = GaugeMetricFamily("modelgrid_deployment_slo_objective_ratio", "Share of requests that are to meet "
                                  "the latency target (the target is a p95)", labels=one)
    violating = GaugeMetricFamily("modelgrid_deployment_slo_violating", "1 while the observed p95 is over the "
                                  "target, as the scheduler last judged it", labels=one)
    p95 = GaugeMetricFamily("modelgrid_deployment_observed_p95_seconds", "p95 latency over the last minute, waiting "
                            "included, as the scheduler last observed it (gateway, else agents)", labels=one)
    for d in deployments:
        info.add_metric([d.name, d.tier, d.state], 1)
        for state, n in sorted(d.replicas.items()):
            replicas.add_metric([d.name, state], n)
        if d.slo_ms:
            target.add_metric([d.name], d.slo_ms / 1000)
            objective.add_metric([d.name], SLO_OBJECTIVE)
            violating.add_metric([d.name], 1 if d.violating else 0)
        if d.p95_ms is not None:
            p95.add_metric([d.name], d.p95_ms / 1000)
    yield from (info, replicas, target, objective, violating, p95)
