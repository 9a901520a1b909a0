"""The Routes pages' form: what was typed into it (a name, a team, branch rows of a target and a weight, a fallback)
to the branches console/routes/services.py takes, checked by the REST API's own schema (RouteIn: weights, how many
branches) before the services check the rest; and a refusal back to the input it is about, a branch's by its row.
A branch's target is written as the route's header names it: `deployment` or `deployment/adapter`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError as PydanticError

from console.accounts.teams import Teams, scoped
from console.catalog.models import Adapter
from console.deployments.models import Deployment
from console.deployments.policy import invalid_from
from console.errors import DomainError, Invalid
from console.routes.models import MAX_BRANCHES, MAX_WEIGHT, Route
from console.routes.schemas import RouteIn

BLANK_ROWS = 2  # a new route's form starts with two branches: a canary split is what most routes are


@dataclass
class RouteForm:
    """What the form shows: the values typed (or stored), its branch rows, and the refusal with the input it is
    about (`field`: name, team, fallback or branches; `row`: the branch row at fault, counted from 0)."""

    name: str = ""
    team: str = ""
    fallback: str = ""
    rows: list[dict[str, str]] = field(default_factory=list)
    error: str = ""
    field: str = ""
    row: int | None = None

    @property
    def given(self) -> list[int]:
        """The rows that name a branch (a row with no target is left out), in the order the services count them."""
        return [i for i, row in enumerate(self.rows) if row["target"]]

    def refused(self, error: DomainError) -> RouteForm:
        """This form with `error` placed beside its input (a branch's beside its row)."""
        loc = [str(p) for p in (error.errors[0]["loc"] if error.errors else [])]
        self.error, self.field = str(error), loc[1] if len(loc) > 1 else ""
        given = self.given
        if self.field == "branches" and len(loc) > 2 and loc[2].isdigit() and int(loc[2]) < len(given):
            self.row = given[int(loc[2])]
        return self


def submitted(form: Mapping[str, Any]) -> RouteForm:
    """The form as posted; its branch rows are the `target` and `weight` lists, in order."""
    targets, weights = form.getlist("target"), form.getlist("weight")
    rows = [{"target": t.strip(), "weight": (weights[i] if i < len(weights) else "").strip()}
            for i, t in enumerate(targets[:MAX_BRANCHES + 1])]  # one past the limit: the schema says why
    return RouteForm(name=form.get("name", "").strip(), team=form.get("team", "").strip(),
                     fallback=form.get("fallback", "").strip(), rows=rows)


def stored(route: Route) -> RouteForm:
    """A route's form as stored, for its edit page."""
    branches = route.branches.select_related("deployment", "adapter")
    return RouteForm(name=route.name, team=route.team.name, fallback=route.fallback.name if route.fallback_id else "",
                     rows=[{"target": b.target, "weight": str(b.weight)} for b in branches])


def blank() -> RouteForm:
    return RouteForm(rows=[{"target": "", "weight": "1"} for _ in range(BLANK_ROWS)])


def branches_of(form: RouteForm) -> list[dict[str, Any]]:
    """The branches the form's rows ask for, checked as the REST API checks a body (weights, how many); Invalid,
    located at the branch, when one is refused."""
    branches = []
    for index in form.given:
        row = form.rows[index]
        deployment, _, adapter = row["target"].partition("/")
        try:
            weight = int(row["weight"] or 1)
        except ValueError:
            message = (f"branch {len(branches)}: weight must be a whole number from 1 to {MAX_WEIGHT}, got "
                       f"{row['weight'][:20]!r}")
            raise Invalid(message, errors=[{"loc": ["body", "branches", len(branches), "weight"], "msg": message,
                                            "type": Invalid.type}]) from None
        branches.append({"deployment": deployment, "adapter": adapter or None, "weight": weight})
    try:
        RouteIn.model_validate({"name": form.name, "branches": branches, "fallback": form.fallback or None})
    except PydanticError as e:
        raise invalid_from(e) from None
    return branches


def target_choices(teams: Teams) -> list[tuple[str, list[tuple[str, str]]]]:
    """The branch targets the viewer may pick, by team: each deployment of `teams`, then each of its adapters as
    `deployment/adapter`. (Team name, [(value, label)]) pairs in name order."""
    deployments = scoped(Deployment.objects.select_related("team"), teams).order_by("team__name", "name")
    adapters: dict[int, list[str]] = {}
    for deployment_id, name in scoped(Adapter.objects, teams).order_by("name").values_list("deployment_id", "name"):
        adapters.setdefault(deployment_id, []).append(name)
    grouped: dict[str, list[tuple[str, str]]] = {}
    for d in deployments:
        options = grouped.setdefault(d.team.name, [])
        options.append((d.name, d.name))
        options += [(f"{d.name}/{a}", f"{d.name} · adapter {a}") for a in adapters.get(d.pk, ())]
    return list(grouped.items())


def fallback_choices(teams: Teams) -> list[tuple[str, list[str]]]:
    """The deployments a route of the viewer's may fall back to, by team."""
    grouped: dict[str, list[str]] = {}
    rows = scoped(Deployment.objects, teams).order_by("team__name", "name").values_list("team__name", "name")
    for team, name in rows:
        grouped.setdefault(team, []).append(name)
    return list(grouped.items())
