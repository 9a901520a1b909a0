"""The console's Prometheus metrics: what the gateway saw of each request, and what the scheduler did.

One registry per console process (prometheus_client's habit); /metrics renders it on each scrape, together
with the fleet's figures read from the database at that moment (console/gateway/fleet_metrics.py)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A deployment's slo_latency_ms is a p95 target: 95% of its requests are to meet it, so 5% is its error budget.
SLO_OBJECTIVE = 0.95


class ConsoleMetrics:
    """Gateway and scheduler series on one registry (tests pass a private one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ("deployment", "adapter")
        self.requests = Counter("modelgrid_gateway_requests", "Requests through the gateway, by outcome",
                                (*labels, "code"), registry=self.registry)
        self.latency = Histogram("modelgrid_gateway_request_seconds", "Time from arrival to the last byte, "
                                 "queueing included (what the client saw)", labels, buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.queue = Histogram("modelgrid_gateway_queue_seconds", "Time a request waited for a ready replica",
                               labels, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("modelgrid_gateway_time_to_first_token_seconds", "Streams: arrival to first event",
                              labels, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.tokens_per_second = Histogram("modelgrid_gateway_stream_tokens_per_second",
                                           "Streams: events per second after the first",
                                           labels, buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000),
                                           registry=self.registry)
        self.demand_waits = Histogram("modelgrid_gateway_demand_wait_seconds", "Waits for a replica to be "
                                      "woken or loaded on demand, by how they ended", ("deployment", "outcome"),
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        # Flow control and predicted time to first token (console/gateway/flow.py, predict.py).
        self.flow_waiting = Gauge("modelgrid_gateway_flow_waiting", "Requests waiting for a replica slot, by band",
                                  ("deployment", "band"), registry=self.registry)
        self.flow_wait = Histogram("modelgrid_gateway_flow_wait_seconds", "Time a request waited for a replica slot, "
                                   "by band", ("deployment", "band"), buckets=LATENCY_BUCKETS, registry=self.registry)
        self.shed = Counter("modelgrid_gateway_shed", "Requests answered 429 saturated at once, by band and why",
                            ("deployment", "band", "reason"), registry=self.registry)
        self.predicted = Histogram("modelgrid_gateway_predicted_ttft_seconds", "Predicted time to first byte of "
                                   "each request sent", ("deployment",), buckets=LATENCY_BUCKETS,
                                   registry=self.registry)
        self.prediction_error = Gauge("modelgrid_gateway_ttft_prediction_mape", "Mean absolute percentage error of "
                                      "recent predicted times to first byte (0.05: 5%)", ("deployment",),
                                      registry=self.registry)
        self.replica_asks = Counter("modelgrid_gateway_replica_asks", "Times the gateway asked the scheduler for "
                                    "another replica because waking or starting one beat queueing",
                                    ("deployment",), registry=self.registry)
        self.pass_seconds = Histogram("modelgrid_scheduler_pass_seconds", "Duration of one scheduler pass that planned",
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        self.actions = Counter("modelgrid_scheduler_actions", "Scheduler decisions that changed a replica "
                               "(place, move, wake, preempt, sleep, stop)", ("action",), registry=self.registry)
        self.refused = Counter("modelgrid_scheduler_placements_refused", "Replicas the scheduler refused a place "
                               "(counted when one becomes refused; scaling to zero is no refusal), by the "
                               "deployment's tier", ("tier",), registry=self.registry)
        self.preemptions = Counter("modelgrid_scheduler_preemptions", "Replicas preempted to make room for a "
                                   "higher tier, by the preempted deployment's tier", ("tier",), registry=self.registry)
        self.slo_requests = Counter("modelgrid_gateway_slo_requests", "Requests to deployments with an SLO: met "
                                    "(no 5xx or 429, within slo_latency_ms, waiting included) or missed",
                                    ("deployment", "outcome"), registry=self.registry)

    def slo(self, deployment: str, target_ms: int | None, status: int, seconds: float) -> None:
        """Count one request against its deployment's SLO (none without a target)."""
        if target_ms:
            self.slo_requests.labels(deployment, slo_outcome(target_ms, status, seconds)).inc()

    def render(self, *fresh: Collector) -> bytes:
        """The registry and `fresh` collectors (read for this scrape) in the text format."""
        return generate_latest(_Together(self.registry, fresh))


def slo_outcome(target_ms: int, status: int, seconds: float) -> str:
    """`met` for an answer within the target without a server-side error (5xx) or a refusal for capacity (429),
    else `missed`."""
    return "met" if status < 500 and status != 429 and seconds * 1000 <= target_ms else "missed"


class _Together:
    """Several collectors as one, for generate_latest (a registry would keep the per-scrape ones forever)."""

    def __init__(self, registry: CollectorRegistry, fresh: tuple[Collector, ...]) -> None:
        self.registry, self.fresh = registry, fresh

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        for collector in self.fresh:
            yield from collector.collect()


METRICS = ConsoleMetrics()
