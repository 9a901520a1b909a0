"""The dry-run planner's input: a JSON document describing a fleet, parsed into a PlanInput with errors that
name the field. Unknown fields are ignored; optional ones take their defaults.

    run_dry_plan(doc, strategy=None) -> dict   # parse, plan, render (render.plan_to_json)
"""

from __future__ import annotations

from typing import Any

from console.scheduler.engines import BUILTIN_ENGINE, ENGINE_CHOICES, engine_labels, engine_selector
from console.scheduler.planner import plan
from console.scheduler.render import plan_to_json
from console.scheduler.types import (
    PROFILES,
    SPREADS,
    STRATEGIES,
    TIERS,
    Deployment,
    Gpu,
    Host,
    Plan,
    PlanInput,
    Replica,
    Settings,
    host_of,
)

_MISSING = object()


class PlanInputError(ValueError):
    """A dry-run document that cannot be planned; the message names the field and what was wrong."""


def run_dry_plan(doc: Any, strategy: str | None = None) -> dict:
    """Plan a described fleet: the output document of `manage.py plan --json` and `POST /api/v1/plan`."""
    return plan_to_json(plan_document(doc, strategy))


def plan_document(doc: Any, strategy: str | None = None) -> Plan:
    """Parse and plan a dry-run document; `strategy` overrides the document's."""
    return plan(parse_input(doc, strategy))


def parse_input(doc: Any, strategy: str | None = None) -> PlanInput:
    """A PlanInput from a dry-run document, or PlanInputError naming the first bad field."""
    if not isinstance(doc, dict):
        raise PlanInputError(f"the plan input must be a JSON object, got {_kind(doc)}")
    chosen = strategy if strategy is not None else _get(doc, "strategy", "", str, "memory-optimized")
    if chosen not in STRATEGIES:
        where = "strategy" if strategy is None else "--strategy"
        raise PlanInputError(f"{where} must be one of {', '.join(STRATEGIES)}, got {chosen!r}")
    gpus = tuple(_gpu(item, f"gpus[{i}]") for i, item in enumerate(_list(doc, "gpus", "", required=True)))
    _unique([g.id for g in gpus], "gpus", "id")
    deployments = tuple(_deployment(item, f"deployments[{i}]")
                        for i, item in enumerate(_list(doc, "deployments", "", required=True)))
    _unique([d.name for d in deployments], "deployments", "name")
    hosts = tuple(_host(item, f"hosts[{i}]") for i, item in enumerate(_list(doc, "hosts", "")))
    replicas = tuple(_replica(item, f"replicas[{i}]") for i, item in enumerate(_list(doc, "replicas", "")))
    settings = Settings(
        quiet_window_s=_number(doc, "quiet_window_s", "", 300.0),
        cooldown_s=_number(doc, "cooldown_s", "", 120.0),
        search_budget_s=_number(doc, "search_budget_s", "", 0.5),
        search_iterations=_integer(doc, "search_iterations", "", None),
        seed=_integer(doc, "seed", "", 0),
        max_moves=_integer(doc, "max_moves", "", None),
        preempt=_get(doc, "preempt", "", bool, True),
    )
    return PlanInput(gpus=gpus, deployments=deployments, replicas=replicas, hosts=hosts, strategy=chosen,
                     buffer_bytes=_integer(doc, "buffer_bytes", "", 0), now=_number(doc, "now", "", 0.0),
                     settings=settings)


def _gpu(item: Any, path: str) -> Gpu:
    _object(item, path)
    gpu_id = _get(item, "id", path, str)
    host = _get(item, "host", path, str, host_of(gpu_id))
    engines = _get(item, "engines", path, list, [BUILTIN_ENGINE])
    if not all(e in ENGINE_CHOICES[1:] for e in engines):
        raise PlanInputError(f"{path}.engines must list engines among {', '.join(ENGINE_CHOICES[1:])}, got {engines!r}")
    return Gpu(id=gpu_id, host=host, total_bytes=_integer(item, "total_bytes", path, positive=True),
               used_bytes=_integer(item, "used_bytes", path, 0),
               labels=_labels(item, "labels", path) | engine_labels(engines), taints=_labels(item, "taints", path))


def _host(item: Any, path: str) -> Host:
    _object(item, path)
    return Host(name=_get(item, "name", path, str), ram_free_bytes=_integer(item, "ram_free_bytes", path, None))


def _deployment(item: Any, path: str) -> Deployment:
    _object(item, path)
    priority = _get(item, "priority", path, str, "standard")
    if priority not in TIERS:
        raise PlanInputError(f"{path}.priority must be one of {', '.join(TIERS)}, got {priority!r}")
    profile = _get(item, "profile", path, str, None)
    if profile is not None and profile not in PROFILES:
        raise PlanInputError(f"{path}.profile must be one of {', '.join(PROFILES)} or null, got {profile!r}")
    low = _integer(item, "min_replicas", path, None)
    high = _integer(item, "max_replicas", path, None)
    replicas = _integer(item, "replicas", path, 1)
    if low is not None and high is not None and low > high:
        raise PlanInputError(f"{path}.min_replicas ({low}) exceeds max_replicas ({high})")
    engine = _get(item, "engine", path, str, "auto")
    if engine not in ENGINE_CHOICES:
        raise PlanInputError(f"{path}.engine must be one of {', '.join(ENGINE_CHOICES)}, got {engine!r}")
    spread = _get(item, "spread", path, str, "preferred")
    if spread not in SPREADS:
        raise PlanInputError(f"{path}.spread must be one of {', '.join(SPREADS)}, got {spread!r}")
    slo = _number(item, "slo_latency_ms", path, None)
    if slo is not None and slo <= 0:
        raise PlanInputError(f"{path}.slo_latency_ms must be a positive number, got {slo!r}")
    return Deployment(
        name=_get(item, "name", path, str),
        bytes=_integer(item, "bytes", path, positive=True),
        replicas=replicas,
        min_replicas=low if low is not None or high is None else min(replicas, high),
        max_replicas=high if high is not None or low is None else max(replicas, low),
        gpus_per_replica=_integer(item, "gpus_per_replica", path, 1, positive=True),
        priority=priority,
        selector=_labels(item, "selector", path) | engine_selector(engine),
        tolerations=_labels(item, "tolerations", path),
        spread=spread,
        slo_latency_ms=slo,
        latency_critical=_get(item, "latency_critical", path, bool, False),
        profile=profile,
        traffic_rps=_number(item, "traffic_rps", path, 0.0),
        observed_latency_ms=_number(item, "observed_latency_ms", path, None),
        violating=_get(item, "violating", path, bool, None),
        status_since=_number(item, "status_since", path, None, signed=True),
        last_scale_at=_number(item, "last_scale_at", path, None, signed=True),
        sleep_bytes=_integer(item, "sleep_bytes", path, None),
    )


def _replica(item: Any, path: str) -> Replica:
    _object(item, path)
    gpus = _get(item, "gpus", path, list, [])
    for i, g in enumerate(gpus):
        if not isinstance(g, str):
            raise PlanInputError(f"{path}.gpus[{i}] must be a GPU id string, got {_kind(g)}")
    state = _get(item, "state", path, str, "ready")
    if state not in ("ready", "sleeping"):
        raise PlanInputError(f"{path}.state must be 'ready' or 'sleeping', got {state!r}")
    return Replica(deployment=_get(item, "deployment", path, str), index=_integer(item, "index", path),
                   gpus=tuple(gpus), reserved_bytes=_integer(item, "reserved_bytes", path, 0), state=state,
                   host=_get(item, "host", path, str, None))


# --- field readers ------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), f"{value!r}")


def _field(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _object(item: Any, path: str) -> None:
    if not isinstance(item, dict):
        raise PlanInputError(f"{path} must be an object, got {_kind(item)}")


def _get(obj: dict, key: str, path: str, kind: type, default: Any = _MISSING) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise PlanInputError(f"{_field(path, key)} is required")
        return default
    if not isinstance(value, kind) or (kind is str and not value):
        article = {str: "a non-empty string", bool: "true or false", list: "a list", dict: "an object"}.get(
            kind, kind.__name__)
        raise PlanInputError(f"{_field(path, key)} must be {article}, got {_kind(value)}")
    return value


def _integer(obj: dict, key: str, path: str, default: Any = _MISSING, positive: bool = False) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise PlanInputError(f"{_field(path, key)} is required")
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < (1 if positive else 0):
        words = "a positive integer" if positive else "a non-negative integer"
        raise PlanInputError(f"{_field(path, key)} must be {words}, got {_kind(value)}")
    return value


def _number(obj: dict, key: str, path: str, default: Any, signed: bool = False) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (value < 0 and not signed):
        words = "a number" if signed else "a non-negative number"
        raise PlanInputError(f"{_field(path, key)} must be {words}, got {_kind(value)}")
    return float(value)


def _list(obj: dict, key: str, path: str, required: bool = False) -> list:
    return _get(obj, key, path, list, _MISSING if required else [])


def _labels(obj: dict, key: str, path: str) -> dict[str, str]:
    labels = _get(obj, key, path, dict, {})
    for k, v in labels.items():
        if not isinstance(v, str):
            raise PlanInputError(f"{_field(path, key)}.{k} must be a string, got {_kind(v)}")
    return dict(labels)


def _unique(values: list[str], where: str, key: str) -> None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise PlanInputError(f"{where}[{i}].{key} {v!r} is a duplicate")
        seen.add(v)
