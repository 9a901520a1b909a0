"""The console's and an agent's registries with every family registered and exercised, as a scrape shows them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import AdapterStats, Metrics, ReplicaSnapshot
from agent.protocol import GpuInfo
from console.gateway.fleet_metrics import DeploymentFigures, FleetCollector, FleetFigures, HostFigures
from console.gateway.metrics import ConsoleMetrics
from tests.docs.promql import exposed_names


def _console() -> CollectorRegistry:
    m = ConsoleMetrics()
    labels = ("chat", "")
    m.requests.labels(*labels, "200").inc()
    for histogram in (m.latency, m.queue, m.ttft, m.tokens_per_second):
        histogram.labels(*labels).observe(0.1)
    m.demand_waits.labels("chat", "served").observe(0.5)
    m.pass_seconds.observe(0.01)
    m.actions.labels("place").inc()
    m.refused.labels("batch").inc()
    m.preemptions.labels("batch").inc()
    m.slo("chat", 200, 200, 0.1)
    # The fleet's figures as one scrape reads them from the database (here without one).
    m.registry.register(FleetCollector(FleetFigures(
        hosts=(HostFigures("h1", "connected", 1), HostFigures("h2", "unknown", 0)),
        deployments=(DeploymentFigures("chat", "critical", "ready", 200, 250.0, True, {"ready": 1}),))))
    return m.registry


def _agent() -> CollectorRegistry:
    m = Metrics(CollectorRegistry())
    m.request_started("chat")
    m.request_finished("chat", None, 200, 0.1, queue_seconds=0.01, batch_size=2)
    m.token("chat", 0.05, first=True)
    m.token("chat", 0.01, first=False)
    m.cancelled("chat", "client")
    m.set_gpus([GpuInfo(index=0, uuid="GPU-0", name="H100", total_bytes=80, used_bytes=50, utilization=40.0,
                        simulated=False, own_bytes=30)])
    m.set_replicas([ReplicaSnapshot("chat", 1, "ready", load_seconds=1.0, wake_seconds=0.1,
                                    adapters=AdapterStats(1, 1, 0, 1))])
    m.set_failures({1: 2})
    return m.registry


@pytest.fixture(scope="session")
def exposed() -> set[str]:
    """Every sample name the console and an agent expose."""
    return exposed_names(_console(), _agent())
