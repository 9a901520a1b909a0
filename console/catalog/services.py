"""Model registration, edits and estimates, and the model store listing (shared by the API and the pages)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

import agent.engines as engines
from agent.artifacts import ArtifactError, ModelArtifact, check_adapter_matches, read_adapter_dir
from agent.artifacts.shape import serving_shape, shape_changes
from console.accounts.models import Team
from console.accounts.teams import ALL, Teams, scoped
from console.bulk import update_values
from console.catalog.calibration import NONE
from console.catalog.fingerprint import fingerprint
from console.catalog.memory import check_seq, current_correction, estimate_path, serving_dtype, settings_estimates
from console.catalog.models import Adapter, Model
from console.catalog.names import is_name, validate_name
from console.changes import begin_rollout, wake_scheduler
from console.deployments.capability import check_engine
from console.errors import Conflict, DomainError, Invalid, NotFound
from console.events.record import Note, record


def register_model(name: str, path: str, actor: str = "", team: Team | None = None) -> Model:
    """Read the artifact at `path`, estimate it and store it as `name`, owned by `team` (else the default team);
    nothing stored on error. `actor` (who asked) goes on the timeline."""
    validate_name(name, "model")
    read = artifact_fields(path)
    try:
        with transaction.atomic():
            model = Model.objects.create(name=name, **({"team": team} if team else {}), **read)
            record([Note(f"model/{name}", "Registered", f"{model.architecture} from {model.path}: "
                         f"{model.parameters:,} parameters, {model.stored_dtype}", actor=actor, folds=False)])
            return model
    except IntegrityError:
        raise Conflict(f"a model named {name!r} is already registered", field="name") from None


def update_model(name: str, path: str, actor: str = "", teams: Teams = ALL) -> Model:
    """Read the model directory at `path` (a new one, or the same one with its files replaced) as registration
    reads it; refused (Invalid naming the path, and what would break: see checked_edit) with nothing stored.
    Unchanged files change nothing. Changed ones give the model new figures and each of its deployments a new
    estimate and a new revision, which the scheduler rolls across their replicas one at a time, drained
    (console/control/rollout.py). `actor` goes on the timeline."""
    from console.deployments.models import Deployment
    from console.deployments.rowlocks import locked

    model = get_model(name, teams=teams)
    artifact, read = read_artifact(path)
    if all(getattr(model, field) == value for field, value in read.items() if field != "shape"):
        if model.shape != read["shape"]:  # a row from before shapes were stored: the same files tell it
            Model.objects.filter(pk=model.pk).update(shape=read["shape"])
            model.shape = read["shape"]
        return model
    with transaction.atomic():
        # Its deployments' rows first, in key order, as every writer of deployment rows takes them; read under the
        # lock, a deployment or adapter created meanwhile is checked against the new files too.
        deployments = list(locked(Deployment.objects.filter(model=model).order_by("pk"), "change"))
        model = get_model(name)
        estimates = checked_edit(model, artifact, read, deployments)
        was = {field: getattr(model, field) for field in read}
        begin_rollout(deployments)  # before the row changes: its replicas hold what they run now
        rolled = [d.name for d in deployments]
        for field, value in read.items():
            setattr(model, field, value)
        model.save(update_fields=list(read))
        update_values(Deployment, ["estimates"], sorted(estimates.items()))
        record([Note(f"model/{name}", "Updated", f"{_what_changed(was, read)}"
                     + (f"; deployment(s) {', '.join(rolled)} restart onto it one replica at a time" if rolled
                        else "; no deployment uses it"), actor=actor, folds=False)])
        transaction.on_commit(wake_scheduler)
    return model


def _what_changed(was: dict, now: dict) -> str:
    if was["path"] != now["path"]:
        said = f"moved from {was['path']} to {now['path']}"
    else:
        said = f"files at {now['path']} read again"
    for field, words in (("parameters", "parameters"), ("weights_bytes", "weight bytes")):
        if was[field] != now[field]:
            said += f"; {words} {was[field]:,} -> {now[field]:,}"
    if was["architecture"] != now["architecture"]:
        said += f"; {was['architecture']} -> {now['architecture']}"
    return said


# What a model's row takes from its files, and only from them (the admin shows them, never takes them typed in).
ARTIFACT_FIELDS = ("architecture", "model_type", "task", "stored_dtype", "parameters", "weights_bytes",
                   "estimate_bytes", "estimate", "shape", "engine_refusals", "fingerprint")


def artifact_fields(path: str) -> dict:
    """A model row's path and ARTIFACT_FIELDS, read now from the model directory at `path`; Invalid naming the
    path and what is wrong with it."""
    return read_artifact(path)[1]


def read_artifact(path: str) -> tuple[ModelArtifact, dict]:
    """The model directory at `path` as read now, and the row fields it gives (artifact_fields)."""
    if not path:
        raise Invalid("path is empty: give the directory that holds config.json and *.safetensors (or a model file "
                      "of an engine's own format, such as GGUF)", field="path")
    try:
        artifact = engines.inspect(path, roots=settings.MODEL_ROOTS)  # by the engine that reads its format
        estimate = engines.estimate_model(artifact, device="cuda")  # a replica on a GPU: stored dtype, batch 1
    except ArtifactError as e:
        raise Invalid(str(e), field="path") from None
    return artifact, {
        "path": str(artifact.path), "architecture": artifact.architecture, "model_type": artifact.model_type,
        "task": artifact.task, "stored_dtype": artifact.stored_dtype, "parameters": artifact.parameters,
        "weights_bytes": artifact.weights_bytes, "estimate_bytes": estimate.total_bytes,
        "estimate": estimate.as_dict(), "shape": serving_shape(artifact),
        "engine_refusals": engines.refusals(engines.shape(artifact, settings.MODEL_ROOTS)),
        "fingerprint": fingerprint(artifact.sources)}


def checked_edit(model: Model, artifact: ModelArtifact, read: dict, deployments) -> dict[int, dict]:
    """Each of `deployments`' (the model's) breakdowns, by primary key, were `model` served from `artifact` (`read`:
    its row fields); Invalid naming the path, what would break and why, when it would break one of them or an
    adapter of theirs. The one rule for a model's edit: the API, the models page and the Django admin use it."""
    deployments = list(deployments)
    if not deployments:
        return {}
    adapters = list(Adapter.objects.filter(deployment__in=deployments).select_related("deployment").order_by("name"))
    changes = shape_changes(model.shape or {"architecture": model.architecture, "task": model.task}, read["shape"])
    if changes:
        users = f"deployment(s) {', '.join(d.name for d in deployments)}"
        if adapters:
            users += f" and adapter(s) {', '.join(a.name for a in adapters)}"
        raise Invalid(f"model {model.name!r} would change its {'; '.join(changes)}, which its {users} are built "
                      "against: a model of another shape is another model; register it under a new name and deploy "
                      "it (a route can move traffic over), or delete those deployments first", field="path")
    for adapter in adapters:
        where = f"adapter {adapter.name!r} of deployment {adapter.deployment.name!r}"
        try:
            files = read_adapter_dir(adapter.path, roots=settings.MODEL_ROOTS)
        except ArtifactError as e:
            raise Invalid(f"{where} cannot be checked against the new files: {e}; fix or delete it first",
                          field="path") from None
        try:
            check_adapter_matches(files, artifact)
        except ArtifactError as e:
            raise Invalid(f"{where} would not fit it: {e}; delete it first (DELETE /api/v1/adapters/"
                          f"{adapter.name}) and register one trained for the new files after", field="path") from None
    moved = Model(**{f.attname: getattr(model, f.attname) for f in Model._meta.concrete_fields} | read)
    return estimates_from(moved, deployments)


def estimates_from(model: Model, deployments) -> dict[int, dict[str, dict]]:
    """Each of `deployments`' breakdowns, by primary key, were it served from `model` (a row as it is about to be
    saved: its files read now); Invalid naming the first deployment that could not be."""
    found = {}
    for dep in deployments:
        try:
            check_seq(model, dep.seq)
            check_engine(model, dep.engine)
            found[dep.pk] = settings_estimates(model, serving_dtype(model, dep.dtype), dep.batch, dep.seq,
                                               dep.adapter_pool_bytes, engine=dep.engine)
        except Invalid as e:
            raise Invalid(f"deployment {dep.name!r} could not be served from it: {e}", field="path") from None
    return found


def get_model(name: str, missing: type[DomainError] = NotFound, teams: Teams = ALL) -> Model:
    """The model called `name` of one of `teams`; `missing` is raised when there is none (NotFound, or Invalid
    when the name came inside a request body)."""
    try:
        if is_name(name):  # else "no such" without asking (PostgreSQL cannot even compare a NUL)
            return scoped(Model.objects.select_related("team"), teams).get(name=name)
    except Model.DoesNotExist:
        pass
    raise missing(f"no model named {name!r}" + ("; register it first (POST /api/v1/models)"
                                                 if missing is Invalid else ""),
                  field="model" if missing is Invalid else None)


def delete_model(name: str, actor: str = "", teams: Teams = ALL) -> None:
    model = get_model(name, teams=teams)
    users = list(model.deployments.values_list("name", flat=True))
    if users:
        raise Conflict(f"model {name!r} is used by deployment(s) {', '.join(users)}; delete those first")
    with transaction.atomic():
        model.delete()
        record([Note(f"model/{name}", "Deleted", f"unregistered (its files stay at {model.path})", actor=actor,
                     folds=False, team=model.team_id)])


def estimate_request(path: str | None, model: str | None, dtype: str | None, batch: int, seq: int | None,
                     device: str, adapter_pool_bytes: int = 0, *, calibrate: bool = True,
                     teams: frozenset[int] | None = None) -> dict:
    """The estimate of a path or a registered model (of one of `teams`; None: any), with the calibration later
    admissions would apply (none with calibrate=False, for a console whose database is not set up)."""
    if bool(path) == bool(model):
        raise Invalid("give exactly one of 'path' (a model directory or file) and 'model' (a registered name)",
                      field="path")
    if model:
        path = get_model(model, teams=teams).path
    est = estimate_path(path, dtype, batch, seq, device, adapter_pool_bytes)
    corr = current_correction(est.family, device) if calibrate else NONE
    return est.as_dict() | {"calibrated_bytes": corr.apply(est.total_bytes), "calibration_factor": corr.factor,
                            "calibrated_from": corr.samples}


@dataclass(frozen=True)
class StoreEntry:
    name: str
    path: Path
    registered: Model | None
    problem: str  # why it cannot be registered, or ""
    weights_bytes: int
    architecture: str


def model_store_entries() -> list[StoreEntry]:
    """Every directory in the model store, and every file an engine reads as a model of its own format, with
    whether it is a usable, registered model."""
    store: Path = settings.MODEL_STORE
    if not store.is_dir():
        return []
    registered = {Path(m.path): m for m in Model.objects.all()}
    entries = []
    for path in sorted(p for p in store.iterdir() if p.is_dir() or _own_format(p)):
        try:
            artifact = engines.inspect(path, roots=settings.MODEL_ROOTS)
            problem, weights, arch = "", artifact.weights_bytes, artifact.architecture
        except ArtifactError as e:
            problem, weights, arch = str(e), 0, ""
        entries.append(StoreEntry(path.name, path, registered.get(path.resolve()), problem, weights, arch))
    return entries


def _own_format(path: Path) -> bool:
    """Whether an engine claims the file at `path` as a model of its own format."""
    try:
        return path.is_file() and engines.reader(path, settings.MODEL_ROOTS) is not engines.BUILTIN
    except ArtifactError:
        return False
