"""Creating, changing and deleting deployments (shared by the API and the pages). Placement itself is
the scheduler loop's job: these only record what the operator wants, after checking it."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from console.catalog.memory import model_positions, serving_dtype, settings_estimates
from console.catalog.models import Model
from console.catalog.services import can_be_name, get_model, validate_name
from console.deployments import policy
from console.deployments.models import Deployment
from console.errors import Conflict, DomainError, Invalid, NotFound
from console.realtime.notify import wake_scheduler

# What an operator may change on a deployment (PATCH, the SLO form); the serving shape is fixed at creation.
POLICY_FIELDS = policy.FIELDS


def create_deployment(
    name: str,
    model: str,
    *,
    dtype: str | None = None,
    batch: int = 1,
    seq: int | None = None,
    **changes: Any,
) -> Deployment:
    """Record a deployment and its memory estimate at its serving settings; nothing stored on error.

    `changes` takes the POLICY_FIELDS given; min/max replicas default to `replicas` (a fixed count)."""
    validate_name(name, "deployment")
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        raise Invalid(f"unknown deployment setting {sorted(unknown)[0]!r}", field=sorted(unknown)[0])
    model_row = get_model(model, missing=Invalid)
    chosen = policy.validate_policy(policy.merged(policy.creation_defaults(changes), changes))
    dtype = serving_dtype(model_row, dtype)
    check_seq(model_row, seq)
    estimates = settings_estimates(model_row, dtype, batch, seq)
    try:
        with transaction.atomic():
            refuse_taken_name(name, "deployment")
            deployment = Deployment.objects.create(
                name=name, model=model_row, dtype=dtype, batch=batch, seq=seq, estimates=estimates,
                **chosen.model_dump(),
            )
            transaction.on_commit(wake_scheduler)
            return deployment
    except IntegrityError:
        raise Conflict(f"a deployment named {name!r} already exists", field="name") from None


def update_deployment(name: str, changes: dict[str, Any]) -> Deployment:
    """Change a deployment's policy (replica counts, priority, SLO, placement constraints); nothing is
    stored when any change is refused. The next scheduler pass acts on it."""
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        field = sorted(unknown)[0]
        raise Invalid(f"{field!r} cannot be changed (changeable: {', '.join(POLICY_FIELDS)})", field=field)
    with transaction.atomic():
        deployment = get_deployment(name)
        current = stored_policy(deployment)
        chosen = policy.validate_policy(policy.merged(current, changes)).model_dump()
        fields = [f for f in POLICY_FIELDS if chosen[f] != current[f]]
        for field in fields:
            setattr(deployment, field, chosen[field])
        if fields:
            deployment.save(update_fields=fields)
            transaction.on_commit(wake_scheduler)
    return deployment


def stored_policy(deployment: Deployment) -> dict[str, Any]:
    return {f: getattr(deployment, f) for f in POLICY_FIELDS}


def check_seq(model: Model, seq: int | None) -> None:
    """A sequence length the model can hold: at most its positions (when its config declares them)."""
    limit = model_positions(model)
    if seq is not None and limit is not None and seq > limit:
        raise Invalid(f"seq {seq} is above the {limit} positions model {model.name!r} can hold", field="seq")


def refuse_taken_name(name: str, kind: str) -> None:
    """Deployments and adapters share one namespace (a request's `model` names either), so a name is taken
    when either holds it."""
    from console.catalog.models import Adapter  # catalog's adapters hang off deployments

    other = "an adapter" if kind == "deployment" else "a deployment"
    taken = Adapter.objects.filter(name=name) if kind == "deployment" else Deployment.objects.filter(name=name)
    if taken.exists():
        raise Conflict(f"{other} is already named {name!r}; deployments and adapters share one namespace "
                       "(a request's model field names either)", field="name")


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
        if can_be_name(name):
            return Deployment.objects.select_related("model").get(name=name)
    except Deployment.DoesNotExist:
        pass
    raise missing(f"no deployment named {name!r}", field="deployment" if missing is Invalid else None)


def delete_deployment(name: str) -> None:
    """Delete the deployment and its replicas; the next scheduler pass tells the agents to stop them."""
    get_deployment(name).delete()
    transaction.on_commit(wake_scheduler)
