"""Creating, changing and deleting deployments (shared by the API and the pages). Placement itself is
the scheduler loop's job: these only record what the operator wants, after checking it."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from console.accounts.models import Team
from console.accounts.teams import ALL, Teams, scoped
from console.bulk import insert, update_in_key_order
from console.catalog.memory import check_seq, deployment_estimates, serving_dtype, settings_estimates
from console.catalog.models import Model
from console.catalog.names import is_name, validate_name
from console.catalog.services import get_model
from console.changes import mark_stale, wake_scheduler
from console.deployments import policy
from console.deployments.capability import check_engine, engine_kinds
from console.deployments.ceiling import check_ceiling
from console.deployments.models import Deployment
from console.deployments.rowlocks import Lock, locked
from console.deployments.schemas import MAX_BULK
from console.errors import Conflict, DomainError, Invalid, NotFound, describe
from console.events.record import Note, deployment_object, record
from console.fleet.models import Host

# What an operator may change on a deployment (PATCH, the SLO form); the serving shape is fixed at creation.
POLICY_FIELDS = policy.FIELDS
# What its memory estimate is made for: fixed once it exists (a new version is a new deployment).
SERVING_FIELDS = ("model", "dtype", "batch", "seq")


def create_deployment(
    name: str,
    model: str,
    *,
    dtype: str | None = None,
    batch: int = 1,
    seq: int | None = None,
    actor: str = "",
    team: Team | None = None,
    teams: Teams = ALL,
    **changes: Any,
) -> Deployment:
    """Record a deployment and its memory estimate at its serving settings; nothing stored on error.

    `changes` takes the POLICY_FIELDS given; min/max replicas default to `replicas` (a fixed count). `actor`
    (who asked: a user, a token) goes on the timeline, as in the other changes here. It belongs to `team` (else the
    model's team) and deploys a model of one of `teams` (the creator's)."""
    validate_name(name, "deployment")
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        raise Invalid(f"unknown deployment setting {sorted(unknown)[0]!r}", field=sorted(unknown)[0])
    model_row = get_model(model, missing=Invalid, teams=teams)
    chosen = policy.validate_policy(policy.merged(policy.creation_defaults(changes), changes))
    check_engine(model_row, chosen.engine)
    dtype = serving_dtype(model_row, dtype)
    check_seq(model_row, seq)
    estimates = settings_estimates(model_row, dtype, batch, seq, recent=True,  # many creates, one read
                                   engine=chosen.engine)
    check_ceiling(chosen.priority, team or model_row.team)
    try:
        with transaction.atomic():
            refuse_taken_name(name, "deployment")
            deployment = Deployment.objects.create(
                name=name, model=model_row, dtype=dtype, batch=batch, seq=seq, estimates=estimates,
                team=team or model_row.team, **chosen.model_dump(),
            )
            record([_created(deployment, actor)])
            transaction.on_commit(wake_scheduler)
            return deployment
    except IntegrityError:
        raise Conflict(f"a deployment named {name!r} already exists", field="name") from None


def update_deployment(name: str, changes: dict[str, Any], actor: str = "", teams: Teams = ALL) -> Deployment:
    """Change a deployment's policy (replica counts, priority, SLO, placement constraints); nothing is
    stored when any change is refused. The next scheduler pass acts on it."""
    unknown = set(changes) - set(POLICY_FIELDS)
    if unknown:
        field = sorted(unknown)[0]
        raise Invalid(f"{field!r} cannot be changed (changeable: {', '.join(POLICY_FIELDS)})", field=field)
    with transaction.atomic():
        # Locked, else a delete meanwhile leaves the save nothing to update.
        deployment = get_deployment(name, lock="change", teams=teams)
        current = stored_policy(deployment)
        chosen = policy.validate_policy(policy.merged(current, changes)).model_dump()
        fields = [f for f in POLICY_FIELDS if chosen[f] != current[f]]
        if "priority" in fields:  # a deployment above a ceiling lowered since keeps its priority until changed
            check_ceiling(chosen["priority"], deployment.team)
        if "engine" in fields:
            check_engine(deployment.model, chosen["engine"])
        for field in fields:
            setattr(deployment, field, chosen[field])
        if "engine" in fields:  # vLLM holds memory of its own: its replicas reserve that too
            deployment.estimates = deployment_estimates(deployment)
            fields.append("estimates")
        if fields:
            deployment.save(update_fields=fields)
            from console.deployments.policy_form import describe_changes  # the words the form's message uses

            record([Note(deployment_object(name), "PolicyChanged", "; ".join(describe_changes(current, deployment)),
                         actor=actor, deployment=name, folds=False)])
            mark_stale([deployment])
            transaction.on_commit(wake_scheduler)
    return deployment


def stored_policy(deployment: Deployment) -> dict[str, Any]:
    return {f: getattr(deployment, f) for f in POLICY_FIELDS}


def refuse_taken_name(name: str, kind: str) -> None:
    """Deployments and adapters share one namespace (a request's `model` names either), so a name is taken
    when either holds it."""
    from console.catalog.models import Adapter  # catalog's adapters hang off deployments

    other = "an adapter" if kind == "deployment" else "a deployment"
    taken = Adapter.objects.filter(name=name) if kind == "deployment" else Deployment.objects.filter(name=name)
    if taken.exists():
        raise Conflict(f"{other} is already named {name!r}; deployments and adapters share one namespace "
                       "(a request's model field names either)", field="name")
    _refuse_route_name(name)


def _refuse_route_name(name: str) -> None:
    """A route's name is taken too: a request's `model` may name a route (console/routes)."""
    from console.routes.models import Route  # routes point at deployments

    if Route.objects.filter(name=name).exists():
        raise Conflict(f"a route is already named {name!r}; routes, deployments and adapters share one namespace "
                       "(a request's model field names any of them)", field="name")


def unused_deployment_name(base: str) -> str:
    """`base`, or `base-2`, `base-3`, ... whichever is free (for one-click deploys)."""
    taken = set(Deployment.objects.filter(name__startswith=base).values_list("name", flat=True))
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base[: 63 - len(str(n)) - 1]}-{n}"
    return name


def get_deployment(name: str, missing: type[DomainError] = NotFound, lock: Lock | None = None,
                   teams: Teams = ALL) -> Deployment:
    """The deployment called `name` of one of `teams` (another team's is as missing as none); `missing` is raised
    when there is none (NotFound, or Invalid when the name came inside a request body). With `lock` (inside a
    transaction) its row stays locked until the end of the transaction (console/deployments/rowlocks.py), before any
    row that points at it is read or written."""
    rows = scoped(Deployment.objects.select_related("model", "team"), teams)
    try:
        if is_name(name):
            return (locked(rows, lock) if lock else rows).get(name=name)
    except Deployment.DoesNotExist:
        pass
    raise missing(f"no deployment named {name!r}", field="deployment" if missing is Invalid else None)


def delete_deployment(name: str, actor: str = "", teams: Teams = ALL) -> None:
    """Delete the deployment and its replicas; the next scheduler pass tells the agents to stop them."""
    with transaction.atomic():
        # Locked before its replicas are read: a pass that wrote some has committed them by then (they go with it),
        # and a pass that has not finds it gone. A DELETE right after the POST raced the first pass here.
        deployment = get_deployment(name, lock="delete", teams=teams)
        # Its rows go with it, so the pass would not see which hosts ran it: they are marked stale, after the
        # delete (deployment, replicas, then hosts: the order a scheduler pass takes its row locks in).
        hosts = list(Host.objects.filter(replicas__deployment=deployment).values_list("pk", flat=True))
        replicas = deployment.replica_set.count()
        deployment.delete()
        update_in_key_order(Host.objects.filter(pk__in=hosts), desired_digest="")
        record([Note(deployment_object(name), "Deleted", f"deleted with its {replicas} replica(s); their workers "
                     "are stopped", actor=actor, deployment=name, folds=False, team=deployment.team_id)])
    transaction.on_commit(wake_scheduler)


def create_deployments(items: list[dict[str, Any]], actor: str = "", team: Team | None = None,
                       teams: Teams = ALL) -> list[Deployment]:
    """Record many deployments at once, all or none. Each item is create_deployment()'s arguments as a dict
    (`name`, `model`, `dtype`, `batch`, `seq` and the POLICY_FIELDS given) and is checked as it checks one;
    every refused item is reported, its errors located at its index (["body", "deployments", 3, "name"]).
    Estimates are made once per model and shape, and the scheduler is woken once. Returns the deployments as created,
    their primary keys not read back. `team` and `teams` as in create_deployment."""
    if not 1 <= len(items) <= MAX_BULK:
        raise Invalid(f"give 1 to {MAX_BULK} deployments, got {len(items)}", field="deployments")
    lookups = _BulkLookups(taken=_taken_names([i.get("name") for i in items]), teams=teams)
    rows, errors, first_index = [], [], {}
    for index, item in enumerate(items):
        try:
            row = _checked_deployment(item, lookups, team)
            if row.name in first_index:
                raise Invalid(f"name {row.name!r} is already given to deployment {first_index[row.name]} of this "
                              "request", field="name")
            first_index[row.name] = index
            rows.append(row)
        except DomainError as e:
            errors += [err | {"loc": ["body", "deployments", index, *err["loc"][1:]]} for err in e.errors]
    if errors:
        refusal = Conflict if all(e["type"] == Conflict.type for e in errors) else Invalid
        raise refusal(f"nothing was created: {describe(errors)}", errors=errors)
    try:
        with transaction.atomic():
            raced = _taken_names(list(first_index))  # created by someone else since the check above
            if raced:
                name, message = next(iter(raced.items()))
                raise Conflict(message, errors=[{"loc": ["body", "deployments", first_index[name], "name"],
                                                 "msg": message, "type": Conflict.type}])
            insert(rows)  # by COPY on PostgreSQL: bulk_create compiled each of a thousand rows (console/bulk.py)
            record([_created(d, actor) for d in rows])
            transaction.on_commit(wake_scheduler)
            return rows
    except IntegrityError:
        raise Conflict("another request created a deployment of the same name meanwhile; nothing was created",
                       field="deployments") from None


class _BulkLookups:
    """What several items of one bulk request share, read once: models, their positions, and estimates (a
    thousand deployments of one model at one shape make one estimate, not a thousand)."""

    def __init__(self, taken: dict[str, str], teams: Teams = ALL):
        self.taken = taken
        self.teams = teams
        self._models: dict[str, Model | DomainError] = {}
        self._seq_checks: dict[tuple[str, int | None], DomainError | None] = {}
        self._estimates: dict[tuple, dict | DomainError] = {}
        self._engine_kinds: dict[str, frozenset[str]] = {}

    @staticmethod
    def _once(cache: dict, key, compute):
        if key not in cache:
            try:
                cache[key] = compute()
            except DomainError as e:
                cache[key] = e
        if isinstance(cache[key], DomainError):
            raise cache[key]
        return cache[key]

    def model(self, name: str) -> Model:
        return self._once(self._models, name, lambda: get_model(name, missing=Invalid, teams=self.teams))

    def check_seq(self, model: Model, seq: int | None) -> None:
        self._once(self._seq_checks, (model.name, seq), lambda: check_seq(model, seq))

    def check_engine(self, model: Model, engine: str) -> None:
        if (model.engine_refusals or {}).get(engine) and engine not in self._engine_kinds:
            self._engine_kinds[engine] = engine_kinds(engine)
        check_engine(model, engine, self._engine_kinds.get(engine))

    def estimates(self, model: Model, dtype: str, batch: int, seq: int | None, engine: str) -> dict:
        return self._once(self._estimates, (model.name, dtype, batch, seq, engine),
                          lambda: settings_estimates(model, dtype, batch, seq, recent=True, engine=engine))


def _checked_deployment(item: dict[str, Any], lookups: _BulkLookups, team: Team | None = None) -> Deployment:
    """One bulk item checked in create_deployment()'s order, as an unsaved row."""
    item = dict(item)
    name, model = item.pop("name", None), item.pop("model", None)
    dtype, batch, seq = item.pop("dtype", None), item.pop("batch", 1), item.pop("seq", None)
    validate_name(name, "deployment")
    unknown = set(item) - set(POLICY_FIELDS)
    if unknown:
        raise Invalid(f"unknown deployment setting {sorted(unknown)[0]!r}", field=sorted(unknown)[0])
    model_row = lookups.model(model)
    chosen = policy.validate_policy(policy.merged(policy.creation_defaults(item), item))
    lookups.check_engine(model_row, chosen.engine)
    dtype = serving_dtype(model_row, dtype)
    lookups.check_seq(model_row, seq)
    estimates = lookups.estimates(model_row, dtype, batch, seq, chosen.engine)
    check_ceiling(chosen.priority, team or model_row.team)
    if name in lookups.taken:
        raise Conflict(lookups.taken[name], field="name")
    # A team always given, not the field's default: that would read the database once per row (the model's team is
    # read once per model: its row is shared by the items that name it).
    return Deployment(name=name, model=model_row, dtype=dtype, batch=batch, seq=seq, estimates=estimates,
                      team=team or model_row.team, **chosen.model_dump())


def _taken_names(names: list) -> dict[str, str]:
    """Which of `names` a deployment or an adapter already holds (one shared namespace, as in
    refuse_taken_name), each with the refusal to give; two queries for any number of names."""
    from console.catalog.models import Adapter  # catalog's adapters hang off deployments

    wanted = [n for n in names if is_name(n)]
    taken = {n: f"a deployment named {n!r} already exists"
             for n in Deployment.objects.filter(name__in=wanted).values_list("name", flat=True)}
    for n in Adapter.objects.filter(name__in=wanted).values_list("name", flat=True):
        taken[n] = (f"an adapter is already named {n!r}; deployments and adapters share one namespace (a request's "
                    "model field names either)")
    from console.routes.models import Route  # routes point at deployments

    for n in Route.objects.filter(name__in=wanted).values_list("name", flat=True):
        taken[n] = f"a route is already named {n!r}; routes, deployments and adapters share one namespace"
    return taken


def _created(d: Deployment, actor: str) -> Note:
    replicas = str(d.min_replicas) if d.min_replicas == d.max_replicas else f"{d.min_replicas}-{d.max_replicas}"
    return Note(deployment_object(d.name), "Created", f"deploys model {d.model.name} ({d.dtype}, batch {d.batch}): "
                f"{replicas} replica(s), priority {d.priority}", actor=actor, deployment=d.name, folds=False)
