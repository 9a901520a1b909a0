"""Creating, changing and deleting routes (the REST API), and reading them for the deployment page. Every check
runs before anything is written, so a refused route stores nothing; the gateways are told to re-read the fleet when
one commits. A route belongs to a team, as a deployment does (console/accounts/teams.py): another team's route is
as missing as none, and its branches and fallback are deployments of its own team."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from console.accounts.models import Team
from console.accounts.teams import ALL, Teams, scoped
from console.catalog.models import Adapter
from console.catalog.names import is_name, validate_name
from console.changes import refresh_gateways
from console.deployments.models import Deployment
from console.errors import Conflict, Invalid, NotFound
from console.events.record import Note, record
from console.routes.models import Branch, Route


def route_object(name: str) -> str:
    return f"route/{name}"


def get_route(name: str, teams: Teams = ALL) -> Route:
    """The route called `name` of one of `teams`; another team's answers as a name nobody has."""
    route = scoped(Route.objects.select_related("team"), teams).filter(name=name).first() if is_name(name) else None
    if route is None:
        raise NotFound(f"no route named {name!r}")
    return route


def create_route(name: str, branches: list[dict[str, Any]], fallback: str | None = None, actor: str = "",
                 team: Team | None = None, teams: Teams = ALL) -> Route:
    """Record a route of `team` (else its first branch's deployment's team) over deployments of `teams` (the
    creator's); refused with the field at fault (nothing stored) when a name or a branch is unusable."""
    validate_name(name, "route")
    try:
        with transaction.atomic():
            refuse_taken_route_name(name)
            rows, fallback_row = _checked(branches, fallback, teams, team)
            route = Route.objects.create(name=name, fallback=fallback_row, team=team or rows[0].deployment.team)
            _store_branches(route, rows)
            record([Note(route_object(name), "Created", describe(route, rows), actor=actor,
                         deployment=rows[0].deployment.name, folds=False)])
            transaction.on_commit(_refresh)
            return route
    except IntegrityError:
        raise Conflict(f"a route named {name!r} already exists", field="name") from None


def update_route(name: str, changes: dict[str, Any], actor: str = "", teams: Teams = ALL) -> Route:
    """Replace a route's branches and/or its fallback (the keys given); the gateways send traffic by it from their
    next snapshot, without a restart."""
    with transaction.atomic():
        route = get_route(name, teams)
        Route.objects.select_for_update().filter(pk=route.pk).first()  # two changes at once: one after the other
        current = list(route.branches.select_related("deployment", "adapter"))
        given = changes.get("branches")
        fallback = changes["fallback"] if "fallback" in changes else (route.fallback.name if route.fallback else None)
        rows, fallback_row = _checked(given if given is not None else [_as_dict(b) for b in current], fallback,
                                      teams, route.team)
        if given is not None:
            route.branches.all().delete()
            _store_branches(route, rows)
        route.fallback = fallback_row
        route.save(update_fields=["fallback", "updated"])
        record([Note(route_object(name), "Changed", describe(route, rows), actor=actor,
                     deployment=rows[0].deployment.name, folds=False)])
        transaction.on_commit(_refresh)
        return route


def delete_route(name: str, actor: str = "", teams: Teams = ALL) -> None:
    with transaction.atomic():
        route = get_route(name, teams)
        first = route.branches.select_related("deployment").first()  # the event concerns it, as the others did
        route.delete()
        record([Note(route_object(name), "Deleted", "deleted: its name no longer routes requests", actor=actor,
                     deployment=first.deployment.name if first else "", folds=False, team=route.team_id)])
        transaction.on_commit(_refresh)


def refuse_taken_route_name(name: str) -> None:
    """Routes, deployments and adapters share one namespace: a request's `model` names any of them."""
    if Deployment.objects.filter(name=name).exists():
        raise Conflict(f"a deployment is already named {name!r}; routes, deployments and adapters share one "
                       "namespace (a request's model field names any of them)", field="name")
    if Adapter.objects.filter(name=name).exists():
        raise Conflict(f"an adapter is already named {name!r}; routes, deployments and adapters share one "
                       "namespace (a request's model field names any of them)", field="name")


def describe(route: Route, branches: list[Branch]) -> str:
    """A route in words, for the timeline: "chat 95%, chat-v2 5%; fallback spare"."""
    total = sum(b.weight for b in branches)
    parts = ", ".join(f"{b.target} {_percent(b.weight, total)}" for b in branches)
    return f"routes to {parts}" + (f"; fallback {route.fallback.name}" if route.fallback else "; no fallback")


def _percent(weight: int, total: int) -> str:
    return f"{100 * weight / total:.4g}%"


def _as_dict(branch: Branch) -> dict[str, Any]:
    return {"deployment": branch.deployment.name, "adapter": branch.adapter.name if branch.adapter_id else None,
            "weight": branch.weight}


def _checked(branches: list[dict[str, Any]], fallback: str | None, teams: Teams = ALL,
             team: Team | None = None) -> tuple[list[Branch], Deployment | None]:
    """Unsaved branch rows and the fallback deployment, or Invalid located at the first field at fault. Only
    deployments of `teams` are found at all; each must be of `team` (None: the first branch's)."""
    if not branches:
        raise Invalid("a route needs at least one branch: a deployment to send its requests to", field="branches")
    names = {b["deployment"] for b in branches} | ({fallback} if fallback else set())
    deployments = {d.name: d for d in scoped(Deployment.objects.select_related("team"), teams).filter(
        name__in=[n for n in names if is_name(n)])}
    adapter_names = [b["adapter"] for b in branches if b.get("adapter") and is_name(b["adapter"])]
    adapters = {a.name: a for a in Adapter.objects.filter(name__in=adapter_names).select_related("deployment")}
    rows, seen = [], set()
    for i, item in enumerate(branches):
        dep = deployments.get(item["deployment"])
        if dep is None:
            raise _at(["branches", i, "deployment"], f"branch {i}: there is no deployment named {item['deployment']!r}")
        team = team or dep.team
        if dep.team_id != team.pk:
            raise _at(["branches", i, "deployment"], _other_team(f"branch {i}: deployment", dep, team))
        adapter = None
        if item.get("adapter") is not None:
            adapter = adapters.get(item["adapter"])
            if adapter is None:
                raise _at(["branches", i, "adapter"], f"branch {i}: there is no adapter named {item['adapter']!r}")
            if adapter.deployment_id != dep.pk:
                raise _at(["branches", i, "adapter"], f"branch {i}: adapter {adapter.name!r} belongs to deployment "
                          f"{adapter.deployment.name!r}, not {dep.name!r}")
        key = (dep.pk, adapter.pk if adapter else None)
        if key in seen:
            raise _at(["branches", i, "deployment"], f"branch {i}: {dep.name}"
                      f"{'/' + adapter.name if adapter else ''} is named twice; give it one branch with the sum of "
                      "the weights")
        seen.add(key)
        rows.append(Branch(position=i, deployment=dep, adapter=adapter, weight=item.get("weight", 1)))
    fallback_row = None
    if fallback is not None:
        fallback_row = deployments.get(fallback)
        if fallback_row is None:
            raise Invalid(f"there is no deployment named {fallback!r} to fall back to", field="fallback")
        if fallback_row.team_id != team.pk:
            raise Invalid(_other_team("fallback: deployment", fallback_row, team), field="fallback")
        if all(r.deployment.pk == fallback_row.pk for r in rows):
            raise Invalid(f"deployment {fallback!r} is already a branch of this route, and its only one: a fallback "
                          "must be another deployment", field="fallback")
    return rows, fallback_row


def _other_team(what: str, dep: Deployment, team: Team) -> str:
    return (f"{what} {dep.name!r} is team {dep.team.name}'s, and the route is team {team.name}'s: a route sends "
            "traffic to its own team's deployments only")


def _at(loc: list, message: str) -> Invalid:
    return Invalid(message, errors=[{"loc": ["body", *loc], "msg": message, "type": Invalid.type}])


def _store_branches(route: Route, rows: list[Branch]) -> None:
    for row in rows:
        row.route = route
    Branch.objects.bulk_create(rows)


def _refresh() -> None:
    refresh_gateways()


def routes_to(deployment: str, teams: Teams = ALL) -> list[dict[str, Any]]:
    """The routes of `teams` that send `deployment` traffic (as a branch or their fallback), for its page: each
    route's name, this deployment's share of its requests, its branches with theirs, and its fallback."""
    rows = scoped(Route.objects.filter(branches__deployment__name=deployment) | Route.objects.filter(
        fallback__name=deployment), teams).distinct().select_related("fallback").prefetch_related(
        "branches__deployment", "branches__adapter")
    out = []
    for route in rows:
        branches = list(route.branches.all())
        total = sum(b.weight for b in branches) or 1
        here = sum(b.weight for b in branches if b.deployment.name == deployment)
        out.append({"name": route.name, "share": _percent(here, total) if here else "",
                    "fallback": route.fallback.name if route.fallback else None,
                    "branches": [{"target": b.target, "percent": _percent(b.weight, total),
                                  "here": b.deployment.name == deployment} for b in branches]})
    return out
