"""The deployment page's "Policy and SLO" form: its text fields to the policy changes
services.update_deployment() takes, and stored policy back to text. Parsing errors are Invalid and carry
the field, as the policy's own refusals do, so the page can point at the input."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from console.deployments.models import Deployment
from console.errors import Invalid
from console.forms import checked, whole_number

# The form's fields, in the order of the form (all of the policy's fields but `replicas`, which is
# the scheduler's to move within [min, max]).
FIELDS = ("priority", "min_replicas", "max_replicas", "idle_timeout_s", "gpus_per_replica", "slo_latency_ms",
          "latency_critical", "profile", "selector", "tolerations", "spread", "max_batch_size", "max_batch_delay_ms",
          "standby", "engine", "engine_args")


def format_selector(selector: Mapping[str, str] | None) -> str:
    """{"gpu": "h100", "zone": "a"} -> "gpu=h100, zone=a"."""
    return ", ".join(f"{k}={v}" for k, v in (selector or {}).items())


def parse_selector(text: str, field: str = "selector", example: str = "gpu=h100, zone=a") -> dict[str, str]:
    """"gpu=h100, zone=a" -> {"gpu": "h100", "zone": "a"}; empty text is none. Selectors, tolerations, host
    labels and taints are all written this way."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.replace("\n", ",").split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise Invalid(f"{field}: {part!r} is not key=value; write them as {example}", field=field)
        if key in out and out[key] != value:
            raise Invalid(f"{field}: label {key!r} is given twice ({out[key]!r} and {value!r})", field=field)
        out[key] = value
    return out


def _whole(form: Mapping[str, str], field: str) -> int | None:
    return whole_number(form.get(field), field)


def parse_policy_form(form: Mapping[str, str]) -> dict[str, Any]:
    """The changes a submitted form asks for. An empty p95 target removes the SLO; an unchecked
    latency_critical box is False; other empty numbers are left out (unchanged)."""
    changes: dict[str, Any] = {}
    for field in ("min_replicas", "max_replicas", "idle_timeout_s", "gpus_per_replica", "max_batch_size"):
        value = _whole(form, field)
        if value is not None:
            changes[field] = value
    changes["slo_latency_ms"] = _whole(form, "slo_latency_ms")
    delay = (form.get("max_batch_delay_ms") or "").strip()
    if delay:
        try:
            changes["max_batch_delay_ms"] = float(delay)
        except ValueError:
            raise Invalid(f"max_batch_delay_ms must be a number of milliseconds, got {delay!r}",
                          field="max_batch_delay_ms") from None
    if form.get("priority"):
        changes["priority"] = form["priority"]
    changes["profile"] = form.get("profile", "")
    changes["latency_critical"] = checked(form, "latency_critical")
    changes["standby"] = checked(form, "standby")
    changes["selector"] = parse_selector(form.get("selector", ""))
    changes["tolerations"] = parse_selector(form.get("tolerations", ""), "tolerations", "pool=ml, team=*")
    if form.get("spread"):
        changes["spread"] = form["spread"]
    if form.get("engine"):
        changes["engine"] = form["engine"]
    if "engine_args" in form:
        try:
            changes["engine_args"] = shlex.split(form["engine_args"])
        except ValueError as e:  # an unclosed quote
            raise Invalid(f"engine arguments: {e}", field="engine_args") from None
    return changes


def policy_values(dep: Deployment) -> dict[str, Any]:
    """The stored policy as the form shows it."""
    return stored_policy(dep) | {"slo_latency_ms": dep.slo_latency_ms or "",
                                 "selector": format_selector(dep.selector),
                                 "tolerations": format_selector(dep.tolerations),
                                 "engine_args": shlex.join(dep.engine_args or []),
                                 "max_batch_delay_ms": f"{dep.max_batch_delay_ms:g}"}


def submitted_values(form: Mapping[str, str]) -> dict[str, Any]:
    """What the person typed, to show again beside a refusal."""
    return {f: form.get(f, "") for f in FIELDS} | {f: checked(form, f) for f in ("latency_critical", "standby")}


_LABELS = {"priority": "priority", "min_replicas": "min replicas", "max_replicas": "max replicas",
           "idle_timeout_s": "idle timeout", "gpus_per_replica": "GPUs per replica", "slo_latency_ms": "p95 target",
           "latency_critical": "latency-critical", "profile": "profile", "selector": "selector",
           "tolerations": "tolerations", "spread": "spread",
           "max_batch_size": "max batch size", "max_batch_delay_ms": "max batch delay", "standby": "standby",
           "engine": "engine", "engine_args": "engine arguments"}


def _shown(field: str, value: Any) -> str:
    if value in (None, "", {}):
        return "none"
    if field in ("selector", "tolerations"):
        return format_selector(value)
    if field == "engine_args":
        return shlex.join(value)
    if field == "slo_latency_ms":
        return f"{value} ms"
    if field == "max_batch_delay_ms":
        return f"{value:g} ms"
    if field == "idle_timeout_s":
        return f"{value} s"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def describe_changes(before: dict[str, Any], after: Deployment) -> list[str]:
    """What a save changed, for the success message: ["priority standard → critical", ...]."""
    out = []
    for field in FIELDS:
        old, new = before[field], getattr(after, field)
        if old != new:
            out.append(f"{_LABELS[field]} {_shown(field, old)} → {_shown(field, new)}")
    return out


def stored_policy(dep: Deployment) -> dict[str, Any]:
    """The policy fields as stored, to compare before and after a save."""
    return {f: getattr(dep, f) for f in FIELDS}
