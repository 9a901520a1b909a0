"""Registering and editing LoRA adapters on a deployment (shared by the API and the pages).

An adapter is read and checked against its deployment's base model torch-free (agent.artifacts):
a missing directory, a non-LoRA adapter or one trained for another base model is refused with a
reason and nothing is stored. The deployment's adapter pool grows by the adapter's bytes, so its
memory estimate (and later reservations) include it: a running replica's reservation and its worker's pool grow
in place (console/control/reconcile.py, agent/workers/adapter_tiers.py). A changed adapter directory rolls the
deployment's replicas onto it one at a time (console/control/rollout.py).
"""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction

from agent.artifacts import ArtifactError, check_adapter_matches, read_adapter_dir, read_model_dir
from agent.artifacts.adapters import CONFIG_NAME, WEIGHTS_NAME
from agent.engines import ENGINES
from console.accounts.teams import ALL, Teams, scoped
from console.catalog.fingerprint import fingerprint
from console.catalog.memory import deployment_estimates, model_format
from console.catalog.models import Adapter
from console.catalog.names import is_name, validate_name
from console.changes import begin_rollout, mark_stale, wake_scheduler
from console.errors import Conflict, Invalid, NotFound
from console.events.record import Note, record


def register_adapter(name: str, deployment: str, path: str, pinned: bool = False, actor: str = "",
                     teams: Teams = ALL) -> Adapter:
    """Read, check and store an adapter for `deployment` (one of `teams`'), in its team; refreshes the
    deployment's memory estimate."""
    from console.deployments.services import get_deployment, refuse_taken_name  # deployments depends on catalog

    validate_name(name, "adapter")
    dep = get_deployment(deployment, missing=Invalid, teams=teams)
    read = artifact_fields(path, dep)
    try:
        with transaction.atomic():
            # Found again, locked: deleted while the files were read, it would leave the pool's update nothing to
            # update and the adapter a deployment that is gone (console/deployments/rowlocks.py).
            dep = get_deployment(deployment, missing=Invalid, lock="change", teams=teams)
            refuse_taken_name(name, "adapter")
            outgrown = _outgrown(dep, read["rank"])
            if outgrown:  # before the row exists: the replicas hold the adapters they serve now
                begin_rollout([dep])
            row = Adapter.objects.create(name=name, deployment=dep, team_id=dep.team_id, pinned=pinned, **read)
            _refresh_pool(dep)
            restart = f"; {outgrown}: they restart one at a time to serve it" if outgrown else ""
            record([Note(f"adapter/{name}", "Registered", f"LoRA rank {row.rank} for deployment {dep.name} from "
                         f"{row.path}{' (pinned)' if pinned else ''}{restart}", actor=actor, deployment=dep.name,
                         folds=False)])
            transaction.on_commit(wake_scheduler)
            return row
    except IntegrityError:
        raise Conflict(f"an adapter named {name!r} is already registered", field="name") from None


def artifact_fields(path: str, dep) -> dict:
    """An adapter row's path and the figures read now from the PEFT directory at `path`, checked against `dep`'s
    base model at its serving dtype; Invalid naming the path and what is wrong with it."""
    if not path:
        raise Invalid("path is empty: give the directory that holds adapter_config.json and adapter_model.safetensors",
                      field="path")
    try:
        adapter = read_adapter_dir(path, roots=settings.MODEL_ROOTS)
        fit = check_adapter_matches(adapter, read_model_dir(dep.model.path, roots=settings.MODEL_ROOTS),
                                    dep.serving_dtype)
    except ArtifactError as e:
        raise Invalid(str(e), field="path") from None
    return {"path": str(adapter.path), "rank": max(m.rank for m in adapter.modules), "modules": len(adapter.modules),
            "parameters": adapter.parameters, "nbytes": fit.nbytes,
            "fingerprint": fingerprint([adapter.path / CONFIG_NAME, adapter.path / WEIGHTS_NAME])}


def _outgrown(dep, rank: int) -> str:
    """Why the engine servers running `dep`'s replicas cannot serve a new adapter of `rank` until they restart (vLLM's
    started without LoRA, or for a smaller --max-lora-rank: Engine.adapter_restart_reason), or "" when they can.
    Built-in engine replicas take any rank: their pools grow in place."""
    from console.control.desired import engine_on  # control depends on catalog
    from console.fleet.models import Gpu, Host

    fixed = ENGINES.get(dep.engine)
    if fixed is not None and not fixed.adapter_restart_reason(dep.name, [], rank):
        return ""  # an engine whose replicas take any adapter as they run
    hosts = dict(Host.objects.filter(replicas__deployment=dep).distinct().values_list("pk", "engines"))
    real = set(Gpu.objects.filter(host_id__in=hosts, simulated=False).values_list("host_id", flat=True))
    running = {engine_on(dep.engine, dep.model.task, engines or {}, pk in real, dep.model.engine_refusals,
                         model_format(dep.model)) for pk, engines in hosts.items()}
    ranks = list(Adapter.objects.filter(deployment=dep).values_list("rank", flat=True))
    return next((why for name in sorted(running) if name in ENGINES
                 if (why := ENGINES[name].adapter_restart_reason(dep.name, ranks, rank))), "")


def update_adapter(name: str, changes: dict, actor: str = "", teams: Teams = ALL) -> Adapter:
    """Change an adapter's directory (a new one, or the same one with its files replaced: read and checked as
    registration does, refused with nothing stored) or its pin. A changed artifact gives its deployment a new pool
    estimate and a new revision, which the scheduler rolls across the replicas one at a time, drained
    (console/control/rollout.py); a pin changes no artifact and restarts nothing."""
    from console.deployments.services import get_deployment  # deployments depends on catalog

    adapter = get_adapter(name, teams)
    read = artifact_fields(changes["path"], adapter.deployment) if "path" in changes else {}
    if all(getattr(adapter, field) == value for field, value in read.items()):
        read = {}
    pinned = changes.get("pinned", adapter.pinned)
    if not read and pinned == adapter.pinned:
        return adapter
    with transaction.atomic():
        dep = get_deployment(adapter.deployment.name, lock="change")  # its deployment's row first, as every writer
        adapter = get_adapter(name)
        said = []
        if read:
            was = {field: getattr(adapter, field) for field in read}
            said.append(f"moved from {was['path']} to {read['path']}" if was["path"] != read["path"]
                        else f"files at {read['path']} read again")
            if was["rank"] != read["rank"]:
                said.append(f"rank {was['rank']} -> {read['rank']}")
            begin_rollout([dep])  # before the row changes: the replicas hold what they run now
            for field, value in read.items():
                setattr(adapter, field, value)
        if pinned != adapter.pinned:
            adapter.pinned = pinned
            said.append("pinned in the device tier" if pinned else "unpinned")
        adapter.save(update_fields=[*read, "pinned"])
        _refresh_pool(dep)
        if read:
            said.append(f"deployment {dep.name} restarts onto it one replica at a time")
        record([Note(f"adapter/{name}", "Updated", "; ".join(said), actor=actor, deployment=dep.name, folds=False)])
        transaction.on_commit(wake_scheduler)
    return adapter


def get_adapter(name: str, teams: Teams = ALL) -> Adapter:
    """The adapter called `name` of one of `teams` (another team's is as missing as none)."""
    try:
        if is_name(name):
            return scoped(Adapter.objects.select_related("deployment", "team"), teams).get(name=name)
    except Adapter.DoesNotExist:
        pass
    raise NotFound(f"no adapter named {name!r}")


def delete_adapter(name: str, actor: str = "", teams: Teams = ALL) -> None:
    from console.deployments.models import Deployment  # deployments depends on catalog
    from console.deployments.rowlocks import locked

    adapter = get_adapter(name, teams)
    with transaction.atomic():
        # Its deployment's row first, as every writer of both takes them (a deployment deleted meanwhile took the
        # adapter along, and two deletes of one adapter take turns here).
        dep = locked(Deployment.objects.filter(pk=adapter.deployment_id), "change").first()
        if dep is None or not Adapter.objects.filter(pk=adapter.pk).exists():
            raise NotFound(f"no adapter named {name!r}")
        adapter.delete()
        _refresh_pool(dep)
        record([Note(f"adapter/{name}", "Deleted", f"removed from deployment {dep.name}", actor=actor,
                     deployment=dep.name, folds=False, team=adapter.team_id)])
        transaction.on_commit(wake_scheduler)


def _refresh_pool(dep) -> None:
    dep.estimates = deployment_estimates(dep)
    dep.save(update_fields=["estimates"])
    mark_stale([dep])  # its replicas' hosts get the new adapter list
