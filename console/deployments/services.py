"""Creating and deleting deployments (shared by the API and the pages). Placement itself is the
scheduler loop's job: these only record what the operator wants."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from console.catalog.memory import serving_dtype, settings_estimates
from console.catalog.models import Model
from console.catalog.services import validate_name
from console.deployments.models import Deployment, Priority
from console.errors import Conflict, DomainError, Invalid, NotFound
from console.realtime.notify import wake_scheduler

MAX_REPLICAS = 64


def create_deployment(
    name: str,
    model: str,
    replicas: int = 1,
    priority: str = Priority.STANDARD,
    *,
    dtype: str | None = None,
    batch: int = 1,
    seq: int | None = None,
) -> Deployment:
    """Record a deployment and its memory estimate at its serving settings; nothing stored on error."""
    validate_name(name, "deployment")
    if not 0 <= replicas <= MAX_REPLICAS:
        raise Invalid(f"replicas must be between 0 and {MAX_REPLICAS}, got {replicas}")
    if priority not in Priority.values:
        raise Invalid(f"priority {priority!r} is not one of {', '.join(Priority.values)}")
    try:
        model_row = Model.objects.get(name=model)
    except Model.DoesNotExist:
        raise Invalid(f"no model named {model!r}; register it first (POST /api/v1/models)") from None
    dtype = serving_dtype(model_row, dtype)
    estimates = settings_estimates(model_row, dtype, batch, seq)
    try:
        with transaction.atomic():
            deployment = Deployment.objects.create(
                name=name, model=model_row, replicas=replicas, priority=priority,
                dtype=dtype, batch=batch, seq=seq, estimates=estimates,
            )
            transaction.on_commit(wake_scheduler)
            return deployment
    except IntegrityError:
        raise Conflict(f"a deployment named {name!r} already exists") from None


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


def scale_deployment(name: str, replicas: int) -> Deployment:
    """Change the replica count; the scheduler adds or removes (highest index first) replicas."""
    if not 0 <= replicas <= MAX_REPLICAS:
        raise Invalid(f"replicas must be between 0 and {MAX_REPLICAS}, got {replicas}")
    with transaction.atomic():
        deployment = get_deployment(name)
        deployment.replicas = replicas
        deployment.save(update_fields=["replicas"])
        transaction.on_commit(wake_scheduler)
    return deployment


def delete_deployment(name: str) -> None:
    """Delete the deployment and its replicas; the next scheduler pass tells the agents to stop them."""
    get_deployment(name).delete()
    transaction.on_commit(wake_scheduler)
