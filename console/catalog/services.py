"""Model registration and the model store listing (shared by the API and the pages)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from agent.artifacts import ArtifactError, estimate_model, inspect_model_dir
from console.catalog.models import Model
from console.catalog.names import is_name, validate_name
from console.errors import Conflict, DomainError, Invalid, NotFound
from console.events.record import Note, record


def register_model(name: str, path: str, actor: str = "") -> Model:
    """Read the artifact at `path`, estimate it and store it as `name`; nothing stored on error. `actor` (who
    asked) goes on the timeline."""
    validate_name(name, "model")
    read = artifact_fields(path)
    try:
        with transaction.atomic():
            model = Model.objects.create(name=name, **read)
            record([Note(f"model/{name}", "Registered", f"{model.architecture} from {model.path}: "
                         f"{model.parameters:,} parameters, {model.stored_dtype}", actor=actor, folds=False)])
            return model
    except IntegrityError:
        raise Conflict(f"a model named {name!r} is already registered", field="name") from None


# What a model's row takes from its files, and only from them (the admin shows them, never takes them typed in).
ARTIFACT_FIELDS = ("architecture", "model_type", "task", "stored_dtype", "parameters", "weights_bytes",
                   "estimate_bytes", "estimate")


def artifact_fields(path: str) -> dict:
    """A model row's path and ARTIFACT_FIELDS, read now from the model directory at `path`; Invalid naming the
    path and what is wrong with it."""
    if not path:
        raise Invalid("path is empty: give the directory that holds config.json and *.safetensors", field="path")
    try:
        artifact = inspect_model_dir(path, roots=settings.MODEL_ROOTS)
        estimate = estimate_model(artifact)
    except ArtifactError as e:
        raise Invalid(str(e), field="path") from None
    return {"path": str(artifact.path), "architecture": artifact.architecture, "model_type": artifact.model_type,
            "task": artifact.task, "stored_dtype": artifact.stored_dtype, "parameters": artifact.parameters,
            "weights_bytes": artifact.weights_bytes, "estimate_bytes": estimate.total_bytes,
            "estimate": estimate.as_dict()}


def get_model(name: str, missing: type[DomainError] = NotFound) -> Model:
    """The model called `name`; `missing` is raised when there is none (NotFound, or Invalid when the name came
    inside a request body)."""
    try:
        if is_name(name):  # else "no such" without asking (PostgreSQL cannot even compare a NUL)
            return Model.objects.get(name=name)
    except Model.DoesNotExist:
        pass
    raise missing(f"no model named {name!r}" + ("; register it first (POST /api/v1/models)"
                                                 if missing is Invalid else ""),
                  field="model" if missing is Invalid else None)


def delete_model(name: str, actor: str = "") -> None:
    model = get_model(name)
    users = list(model.deployments.values_list("name", flat=True))
    if users:
        raise Conflict(f"model {name!r} is used by deployment(s) {', '.join(users)}; delete those first")
    with transaction.atomic():
        model.delete()
        record([Note(f"model/{name}", "Deleted", f"unregistered (its files stay at {model.path})", actor=actor,
                     folds=False)])


@dataclass(frozen=True)
class StoreEntry:
    name: str
    path: Path
    registered: Model | None
    problem: str  # why it cannot be registered, or ""
    weights_bytes: int
    architecture: str


def model_store_entries() -> list[StoreEntry]:
    """Every directory in the model store, with whether it is a usable, registered model."""
    store: Path = settings.MODEL_STORE
    if not store.is_dir():
        return []
    registered = {Path(m.path): m for m in Model.objects.all()}
    entries = []
    for path in sorted(p for p in store.iterdir() if p.is_dir()):
        try:
            artifact = inspect_model_dir(path, roots=settings.MODEL_ROOTS)
            problem, weights, arch = "", artifact.weights_bytes, artifact.architecture
        except ArtifactError as e:
            problem, weights, arch = str(e), 0, ""
        entries.append(StoreEntry(path.name, path, registered.get(path.resolve()), problem, weights, arch))
    return entries
