"""Creating, changing and deleting deployments (shared by the API and the pages). Placement itself is
the scheduler loop's job: these only record what the operator wants, after checking it."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from console.catalog.memory import serving_dtype, settings_estimates
from console.catalog.models import Model
from console.catalog.services import validate_name
from console.deployments.models import Deployment, Priority, Profile
from console.errors import Conflict, DomainError, Invalid, NotFound
from console.realtime.notify import wake_scheduler

MAX_REPLICAS = 64
MAX_GANG = 16
MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600
# What an operator may change on a deployment (PATCH, the SLO form); the serving shape is fixed at creation.
POLICY_FIELDS = ("replicas", "min_replicas", "max_replicas", "gpus_per_replica", "priority", "selector",
                 "slo_latency_ms", "latency_critical", "profile", "max_batch_size", "max_batch_delay_ms", "standby",
                 "idle_timeout_s")


def create_deployment(
    name: str,
    model: str,
    replicas: int = 1,
    priority: str = Priority.STANDARD,
    *,
    dtype: str | None = None,
    batch: int = 1,
    seq: int | None = None,
    **policy: Any,
) -> Deployment:
    """Record a deployment and its memory estimate at its serving settings; nothing stored on error.

    `policy` takes the other POLICY_FIELDS; min/max replicas default to `replicas` (a fixed count)."""
    validate_name(name, "deployment")
    unknown = set(policy) - set(POLICY_FIELDS)
    if unknown:
        raise Invalid(f"unknown deployment setting {sorted(unknown)[0]!r}")
    try:
        model_row = Model.objects.get(name=model)
    except Model.DoesNotExist:
        raise Invalid(f"no model named {model!r}; register it first (POST /api/v1/models)") from None
    fields = _checked_policy(Deployment(), {"replicas": replicas, "priority": priority} | policy)
    dtype = serving_dtype(model_row, dtype)
    estimates = settings_estimates(model_row, dtype, batch, seq)
    try:
        with transaction.atomic():
            deployment = Deployment.objects.create(
                name=name, model=model_row, dtype=dtype, batch=batch, seq=seq, estimates=estimates, **fields
            )
            transaction.on_commit(wake_scheduler)
            return deployment
    except IntegrityError:
        raise Conflict(f"a deployment named {name!r} already exists") from None


def update_deployment(name: str, changes: dict[str, Any]) -> Deployment:
    """Change a deployment's policy (replica counts, priority, SLO, placement constraints); nothing is
    stored when any change is refused. The next scheduler pass acts on it."""
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        raise Invalid(f"{sorted(unknown)[0]!r} cannot be changed (changeable: {', '.join(POLICY_FIELDS)})")
    with transaction.atomic():
        deployment = get_deployment(name)
        fields = _checked_policy(deployment, changes)
        for field, value in fields.items():
            setattr(deployment, field, value)
        deployment.save(update_fields=list(fields))
        transaction.on_commit(wake_scheduler)
    return deployment


def _checked_policy(current: Deployment, changes: dict[str, Any]) -> dict[str, Any]:
    """The fields to store for `changes` on top of `current`, or Invalid naming the first bad one.

    `replicas` alone sets a fixed count (min = max = replicas); min/max alone keep the current count
    inside the new range (the scheduler moves it within the range by SLO)."""
    out: dict[str, Any] = {}
    for field in ("replicas", "min_replicas", "max_replicas"):
        if changes.get(field) is not None:
            out[field] = _whole(changes[field], field, 0, MAX_REPLICAS)
    if "replicas" in out and "min_replicas" not in out and "max_replicas" not in out:
        out["min_replicas"] = out["max_replicas"] = out["replicas"]
    elif "min_replicas" in out or "max_replicas" in out:
        low = out.get("min_replicas", current.min_replicas)
        # Creating with a minimum only: the maximum is the minimum. Changing a stored one: as stored.
        high = out.get("max_replicas", max(current.max_replicas, low) if current.pk is None else current.max_replicas)
        if low > high:
            raise Invalid(f"min_replicas {low} is above max_replicas {high}")
        out["min_replicas"], out["max_replicas"] = low, high
        out["replicas"] = min(max(out.get("replicas", current.replicas), low), high)
    if "gpus_per_replica" in changes:
        out["gpus_per_replica"] = _whole(changes["gpus_per_replica"], "gpus_per_replica", 1, MAX_GANG)
    if "priority" in changes:
        if changes["priority"] not in Priority.values:
            raise Invalid(f"priority {changes['priority']!r} is not one of {', '.join(Priority.values)}")
        out["priority"] = changes["priority"]
    if "profile" in changes:
        profile = changes["profile"] or ""
        if profile not in Profile.values:
            raise Invalid(f"profile {profile!r} is not one of compute, memory, io (or empty: unknown)")
        out["profile"] = profile
    if "selector" in changes:
        out["selector"] = _selector(changes["selector"])
    if "slo_latency_ms" in changes:
        value = changes["slo_latency_ms"]
        out["slo_latency_ms"] = None if value in (None, "", 0) else _whole(value, "slo_latency_ms", 1, 3_600_000)
    if "max_batch_size" in changes:
        out["max_batch_size"] = _whole(changes["max_batch_size"], "max_batch_size", 1, 1024)
    if "max_batch_delay_ms" in changes:
        delay = changes["max_batch_delay_ms"]
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 10_000:
            raise Invalid(f"max_batch_delay_ms must be a number of milliseconds between 0 and 10000, got {delay!r}")
        out["max_batch_delay_ms"] = float(delay)
    if "idle_timeout_s" in changes:
        idle = changes["idle_timeout_s"]
        if isinstance(idle, bool) or not isinstance(idle, int) or not 1 <= idle <= MAX_IDLE_TIMEOUT_S:
            raise Invalid(f"idle_timeout_s must be a whole number of seconds between 1 and {MAX_IDLE_TIMEOUT_S} "
                          f"(7 days), got {idle!r}")
        out["idle_timeout_s"] = idle
    for flag in ("latency_critical", "standby"):
        if flag in changes:
            if not isinstance(changes[flag], bool):
                raise Invalid(f"{flag} must be true or false, got {changes[flag]!r}")
            out[flag] = changes[flag]
    return out


def _whole(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Invalid(f"{field} must be a whole number between {low} and {high}, got {value!r}")
    return value


def _selector(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Invalid(f"selector must map label names to values (strings), e.g. {{\"gpu\": \"h100\"}}, got {value!r}")
    too_long = [k for k, v in value.items() if not k or len(k) > 63 or len(v) > 63]
    if too_long:
        raise Invalid(f"selector label {too_long[0]!r}: names and values are 1-63 characters")
    return dict(value)


def unused_deployment_name(base: str) -> str:
    """`base`, or `base-2`, `base-3`, ... whichever is free (for one-click deploys)."""
    taken = set(Deployment.objects.filter(name__startswith=base).values_list("name", flat=True))
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base[: 63 - len(str(n)) - 1]}-{n}"
    return name


def get_deployment(name: str, missing: type[DomainError] = NotFound) -> Deployment:
    """The deployment called `name`; `missing` is raised when there is none (NotFound, or Invalid when
    the name came inside a request body)."""
    try:
        return Deployment.objects.select_related("model").get(name=name)
    except Deployment.DoesNotExist:
        raise missing(f"no deployment named {name!r}") from None


def delete_deployment(name: str) -> None:
    """Delete the deployment and its replicas; the next scheduler pass tells the agents to stop them."""
    get_deployment(name).delete()
    transaction.on_commit(wake_scheduler)
