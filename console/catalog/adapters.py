"""Registering LoRA adapters on a deployment (shared by the API and the pages).

An adapter is read and checked against its deployment's base model torch-free (agent.artifacts):
a missing directory, a non-LoRA adapter or one trained for another base model is refused with a
reason and nothing is stored. The deployment's adapter pool grows by the adapter's bytes, so its
memory estimate (and later reservations) include it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction

from agent.artifacts import ArtifactError, check_adapter_matches, read_adapter_dir, read_model_dir
from console.catalog.memory import deployment_estimates
from console.catalog.models import Adapter
from console.catalog.names import is_name, validate_name
from console.errors import Conflict, Invalid, NotFound
from console.events.record import Note, record
from console.realtime.notify import wake_scheduler


def register_adapter(name: str, deployment: str, path: str, pinned: bool = False, actor: str = "") -> Adapter:
    """Read, check and store an adapter for `deployment`; refreshes the deployment's memory estimate."""
    from console.deployments.services import get_deployment, refuse_taken_name  # deployments depends on catalog

    validate_name(name, "adapter")
    if not path:
        raise Invalid("path is empty: give the directory that holds adapter_config.json and adapter_model.safetensors",
                      field="path")
    dep = get_deployment(deployment, missing=Invalid)
    try:
        adapter = read_adapter_dir(path, roots=settings.MODEL_ROOTS)
        fit = check_adapter_matches(adapter, read_model_dir(dep.model.path, roots=settings.MODEL_ROOTS),
                                    dep.serving_dtype)
    except ArtifactError as e:
        raise Invalid(str(e), field="path") from None
    try:
        with transaction.atomic():
            # Found again, locked: deleted while the files were read, it would leave the pool's update nothing to
            # update and the adapter a deployment that is gone (console/deployments/rowlocks.py).
            dep = get_deployment(deployment, missing=Invalid, lock="change")
            refuse_taken_name(name, "adapter")
            row = Adapter.objects.create(
                name=name, deployment=dep, path=str(adapter.path), rank=max(m.rank for m in adapter.modules),
                modules=len(adapter.modules), parameters=adapter.parameters, nbytes=fit.nbytes, pinned=pinned,
            )
            _refresh_pool(dep)
            record([Note(f"adapter/{name}", "Registered", f"LoRA rank {row.rank} for deployment {dep.name} from "
                         f"{row.path}{' (pinned)' if pinned else ''}", actor=actor, deployment=dep.name, folds=False)])
            transaction.on_commit(wake_scheduler)
            return row
    except IntegrityError:
        raise Conflict(f"an adapter named {name!r} is already registered", field="name") from None


def get_adapter(name: str) -> Adapter:
    try:
        if is_name(name):
            return Adapter.objects.select_related("deployment").get(name=name)
    except Adapter.DoesNotExist:
        pass
    raise NotFound(f"no adapter named {name!r}")


def delete_adapter(name: str, actor: str = "") -> None:
    from console.deployments.models import Deployment  # deployments depends on catalog
    from console.deployments.rowlocks import locked

    adapter = get_adapter(name)
    with transaction.atomic():
        # Its deployment's row first, as every writer of both takes them (a deployment deleted meanwhile took the
        # adapter along, and two deletes of one adapter take turns here).
        dep = locked(Deployment.objects.filter(pk=adapter.deployment_id), "change").first()
        if dep is None or not Adapter.objects.filter(pk=adapter.pk).exists():
            raise NotFound(f"no adapter named {name!r}")
        adapter.delete()
        _refresh_pool(dep)
        record([Note(f"adapter/{name}", "Deleted", f"removed from deployment {dep.name}", actor=actor,
                     deployment=dep.name, folds=False)])
        transaction.on_commit(wake_scheduler)


def _refresh_pool(dep) -> None:
    from console.control.desired import mark_stale  # deployments depends on catalog

    dep.estimates = deployment_estimates(dep)
    dep.save(update_fields=["estimates"])
    mark_stale([dep])  # its replicas' hosts get the new adapter list
