"""A dry-run document's deployments sized from their models: one that names a `model` (a registered name or a
model directory) instead of giving `bytes` gets the calibrated estimate the console would reserve for one replica
at its `dtype`, `batch` and `seq`. The pure planner never reads files; this runs before it."""

from __future__ import annotations

import os
from typing import Any

from console.catalog.services import estimate_request
from console.errors import DomainError
from console.scheduler.dryrun import PlanInputError


def sized(doc: Any, calibrate: bool = True, relative_to: str | None = None) -> Any:
    """`doc` with `bytes` filled in for each deployment that names a `model` and gives no `bytes`. A name with a
    slash is a path (relative to `relative_to`, e.g. the shell's directory, when given); else a registered
    model. PlanInputError names the deployment when its model cannot be estimated."""
    items = doc.get("deployments") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return doc  # the planner's parser says what is wrong with it
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and "bytes" not in item and "model" in item:
            item = item | {"bytes": _bytes(item, f"deployments[{i}]", calibrate, relative_to)}
        out.append(item)
    return doc | {"deployments": out}


def _bytes(item: dict, path: str, calibrate: bool, relative_to: str | None) -> int:
    model = item["model"]
    if not isinstance(model, str) or not model:
        raise PlanInputError(f"{path}.model must be a registered model's name or a model directory")
    settings = {k: item.get(k) for k in ("dtype", "batch", "seq")}
    for key, kind in (("dtype", str), ("batch", int), ("seq", int)):
        value = settings[key]
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise PlanInputError(f"{path}.{key} must be {'a string' if kind is str else 'an integer'}, got {value!r}")
    is_path = "/" in model or model.startswith(".")
    if is_path and relative_to is not None:
        model = os.path.join(relative_to, model)
    try:
        found = estimate_request(model if is_path else None, None if is_path else model, settings["dtype"],
                                 settings["batch"] or 1, settings["seq"], item.get("device", "cuda"),
                                 calibrate=calibrate)
    except DomainError as e:
        raise PlanInputError(f"{path}.model {item['model']!r}: {e}") from None
    return found["calibrated_bytes"]
