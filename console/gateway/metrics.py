"""The console's Prometheus metrics: what the gateway saw of each request, and what the scheduler did.

One registry per console process (prometheus_client's habit); /metrics renders it on each scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


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
        self.pass_seconds = Histogram("modelgrid_scheduler_pass_seconds", "Duration of one scheduler pass",
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        self.actions = Counter("modelgrid_scheduler_actions", "Scheduler decisions that changed a replica "
                               "(place, move, wake, preempt, sleep, stop)", ("action",), registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


METRICS = ConsoleMetrics()
