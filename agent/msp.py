"""The Model Server Protocol's metrics (torch-free): what an endpoint picker scrapes from a model server.

The Gateway API inference extension's endpoint picker (EPP, also llm-d's) reads a handful of series from each
endpoint's Prometheus page: waiting and running requests, KV-cache usage (0-1), the LoRA adapters running and
waiting with the most a batch may mix, and the KV cache's block size and block count for its prefix scorer. Its
default mapping is vLLM's names, so these are rendered under them (`vllm:num_requests_waiting`, ...), labelled
with `model_name` as vLLM labels them: a stock picker reads ModelGrid's endpoints with no engine configuration.

Every engine's figures become one EndpointLoad (the built-in engine's from its worker's batcher and adapter
pool, vLLM's and llama.cpp's parsed from their own pages), and several replicas of one deployment on a host
combine into one, since a picker's endpoint is an address and a port, and the agent picks among its replicas.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # vLLM before 0.10 (V0's name)
LORA_INFO = "vllm:lora_requests_info"
CACHE_INFO = "vllm:cache_config_info"
LLAMACPP_RUNNING = "llamacpp:requests_processing"
LLAMACPP_WAITING = "llamacpp:requests_deferred"
LLAMACPP_KV_USAGE = "llamacpp:kv_cache_usage_ratio"  # gone from recent llama.cpp servers; read where present
VLLM_FAMILIES = (WAITING, RUNNING, KV_USAGE, KV_USAGE_OLD, LORA_INFO, CACHE_INFO)
LLAMACPP_FAMILIES = (LLAMACPP_WAITING, LLAMACPP_RUNNING, LLAMACPP_KV_USAGE)


@dataclass(frozen=True)
class EndpointLoad:
    """One endpoint's figures, as the protocol defines them; None where the engine does not say."""

    model_name: str
    waiting: int = 0  # requests queued, not yet running
    running: int = 0  # requests in the running batch
    kv_usage: float | None = None  # share of the KV cache in use, 0-1
    running_adapters: tuple[str, ...] = ()  # adapters a request can run with now, without loading one
    waiting_adapters: tuple[str, ...] = ()  # adapters that waiting requests asked for
    max_lora: int | None = None  # adapters one batch may mix; None: the replica serves no adapters
    block_size: int | None = None  # tokens per KV-cache block (paged engines)
    num_blocks: int | None = None  # KV-cache blocks on the device


def builtin_load(handle: Any) -> EndpointLoad:
    """A built-in (torch) replica's figures: its batcher's last step, KV bytes against the KV share of its
    reservation (agent.workers.runtime), adapters from its batch and its pool's device tier."""
    stats = handle.engine_stats
    capacity = handle.info.get("kv_capacity_bytes") or 0
    kv = min(1.0, stats.kv_cache_bytes / capacity) if capacity > 0 else None
    pooled = handle.adapters or handle.adapter_stats
    on_device = {a.name for a in handle.adapter_stats if a.tier == "gpu"}
    return EndpointLoad(
        model_name=handle.spec.deployment,
        waiting=stats.waiting,
        running=stats.running,
        kv_usage=kv,
        running_adapters=tuple(sorted(on_device | set(stats.running_adapters))),
        waiting_adapters=tuple(sorted(set(stats.waiting_adapters))),
        max_lora=handle.info.get("max_loras", len(on_device)) if pooled else None,
    )


def vllm_load(model_name: str, text: str) -> EndpointLoad:
    """A vLLM server's figures from its own /metrics page (summed over its engines where it runs several)."""
    families = _parse(text, VLLM_FAMILIES)
    lora = _latest(families.get(LORA_INFO))
    cache = _first(families.get(CACHE_INFO))
    kv = _mean(families.get(KV_USAGE) or families.get(KV_USAGE_OLD))
    return EndpointLoad(
        model_name=model_name,
        waiting=int(_sum(families.get(WAITING))),
        running=int(_sum(families.get(RUNNING))),
        kv_usage=kv,
        running_adapters=_names(lora, "running_lora_adapters"),
        waiting_adapters=_names(lora, "waiting_lora_adapters"),
        max_lora=_int(lora, "max_lora"),
        block_size=_int(cache, "block_size"),
        num_blocks=_int(cache, "num_gpu_blocks"),
    )


def llamacpp_load(model_name: str, text: str) -> EndpointLoad:
    """A llama.cpp server's figures from its /metrics page: requests processing and deferred; its KV usage only
    where the server still reports it, and no adapters (the agent runs it without any)."""
    families = _parse(text, LLAMACPP_FAMILIES)
    return EndpointLoad(
        model_name=model_name,
        waiting=int(_sum(families.get(LLAMACPP_WAITING))),
        running=int(_sum(families.get(LLAMACPP_RUNNING))),
        kv_usage=_mean(families.get(LLAMACPP_KV_USAGE)),
    )


def combine(model_name: str, loads: Iterable[EndpointLoad]) -> EndpointLoad:
    """Several replicas of one deployment on a host as one endpoint: requests add up, KV usage is their mean
    (weighted by blocks where every one is paged), adapters are their union and the batch limits add up."""
    loads = list(loads)
    if len(loads) == 1:
        return loads[0]
    paged = all(load.num_blocks for load in loads if load.kv_usage is not None)
    kvs = [(load.kv_usage, load.num_blocks if paged else 1) for load in loads if load.kv_usage is not None]
    limits = [load.max_lora for load in loads if load.max_lora is not None]
    sizes = {load.block_size for load in loads}
    return EndpointLoad(
        model_name=model_name,
        waiting=sum(load.waiting for load in loads),
        running=sum(load.running for load in loads),
        kv_usage=sum(u * w for u, w in kvs) / sum(w for _, w in kvs) if kvs else None,
        running_adapters=tuple(sorted({a for load in loads for a in load.running_adapters})),
        waiting_adapters=tuple(sorted({a for load in loads for a in load.waiting_adapters})),
        max_lora=sum(limits) if limits else None,
        # One block size for the prefix scorer's hashing: only when every replica pages alike.
        block_size=sizes.pop() if len(sizes) == 1 else None,
        num_blocks=sum(load.num_blocks for load in loads if load.num_blocks) or None,
    )


def render(load: EndpointLoad, now: float | None = None) -> bytes:
    """The exposition an endpoint picker scrapes (Prometheus text format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(_families(load, time.time() if now is None else now))))
    return generate_latest(registry)


def _families(load: EndpointLoad, now: float) -> Iterator[Metric]:
    labels = ["model_name"]
    name = [load.model_name]
    waiting = GaugeMetricFamily(WAITING, "Requests waiting to be processed.", labels=labels)
    waiting.add_metric(name, load.waiting)
    running = GaugeMetricFamily(RUNNING, "Requests in model execution batches.", labels=labels)
    running.add_metric(name, load.running)
    yield from (waiting, running)
    if load.kv_usage is not None:
        kv = GaugeMetricFamily(KV_USAGE, "KV-cache usage. 1 means 100 percent usage.", labels=labels)
        kv.add_metric(name, load.kv_usage)
        yield kv
    if load.max_lora is not None:
        # As vLLM's: one series whose labels are the lists and whose value is when they were taken, so a picker
        # that keeps the newest series by value reads the current one.
        lora = GaugeMetricFamily(LORA_INFO, "Running stats on lora requests.",
                                 labels=[*labels, "max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        lora.add_metric([*name, str(load.max_lora), ",".join(load.waiting_adapters),
                         ",".join(load.running_adapters)], now)
        yield lora
    if load.block_size is not None:
        cache = GaugeMetricFamily(CACHE_INFO, "Information of the LLMEngine CacheConfig",
                                  labels=[*labels, "block_size", "num_gpu_blocks"])
        cache.add_metric([*name, str(load.block_size), str(load.num_blocks or "")], 1)
        yield cache


class _Families:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def _parse(text: str, names: tuple[str, ...]) -> dict[str, Metric]:
    """The families `names` of an exposition, their lines picked out first: a picker scrapes every 50 ms by
    default, and parsing vLLM's whole page (50 kB) took 21 ms here, 40% of a core per replica; these lines, 1.5 ms."""
    prefixes = tuple(p for n in names for p in (f"{n}{{", f"{n} ", f"# HELP {n} ", f"# TYPE {n} "))
    picked = "\n".join(line for line in text.splitlines() if line.startswith(prefixes))
    return {f.name: f for f in text_string_to_metric_families(picked + "\n")}


def _sum(family: Metric | None) -> float:
    return sum(s.value for s in family.samples) if family is not None else 0.0


def _mean(family: Metric | None) -> float | None:
    if family is None or not family.samples:
        return None
    return sum(s.value for s in family.samples) / len(family.samples)


def _first(family: Metric | None) -> dict[str, str]:
    return dict(family.samples[0].labels) if family is not None and family.samples else {}


def _latest(family: Metric | None) -> dict[str, str]:
    # vLLM keeps a series per combination of lists it has seen; the one set most recently is the current one.
    if family is None or not family.samples:
        return {}
    return dict(max(family.samples, key=lambda s: s.value).labels)


def _names(labels: dict[str, str], key: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in labels.get(key, "").split(",") if n.strip())


def _int(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None
