"""vLLM's own metrics, relayed on the agent's /metrics: each serving vLLM replica's exposition, read from its
server, every series labelled with the replica's deployment and name ("chat#0") as the agent's own series are,
and the families of all replicas merged (one HELP and TYPE each, as the text format requires). Parsed and
rendered in a thread: a busy vLLM exposes thousands of lines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from agent.serving.dispatch import engine_of

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 2.0


async def engine_metrics(session: aiohttp.ClientSession, handles: Iterable[Any]) -> bytes:
    """The merged exposition of every ready vLLM replica among `handles` (b"" when there is none); a replica
    that does not answer in time is left out of this scrape."""
    replicas = [h for h in handles if engine_of(h).relays_metrics and h.state == "ready" and "port" in h.info]
    if not replicas:
        return b""
    texts = await asyncio.gather(*(scrape(session, h) for h in replicas))
    scraped = [(h, text) for h, text in zip(replicas, texts, strict=True) if text]
    return await asyncio.to_thread(merge, scraped) if scraped else b""


async def scrape(session: aiohttp.ClientSession, handle: Any) -> str:
    """One engine server's own /metrics page, read with its key ("" when it does not answer in time)."""
    url = f"http://127.0.0.1:{handle.info['port']}/metrics"
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            async with session.get(url, headers={"Authorization": f"Bearer {handle.info['key']}"}) as response:
                return await response.text() if response.status == 200 else ""
    except (TimeoutError, aiohttp.ClientError) as e:
        log.info("replica %d: no engine metrics this scrape (%s)", handle.spec.replica_id, e or type(e).__name__)
        return ""


def merge(scraped: list[tuple[Any, str]]) -> bytes:
    """One exposition from several replicas' texts, each sample labelled with its replica."""
    families: dict[str, Metric] = {}
    for handle, text in scraped:
        labels = {"deployment": handle.spec.deployment, "replica": handle.spec.label}  # as the agent's own series
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            merged.samples += [s._replace(labels=s.labels | labels) for s in family.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected(list(families.values())))
    return generate_latest(registry)


class _Collected:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics
