"""Routes in the gateway's snapshot: a public model name and the branches it sends requests to by weight, read with
the fleet (console/gateway/fleet.py) so choosing a branch is one draw and one bisect, never a database read."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from console.routes.models import Branch, Route

ROUTE_HEADER = "x-modelgrid-route"
# A branch's answers that send the request on once, to the route's fallback: refused (the scheduler's 503, no replica
# in time), overloaded (a limit's 429, an agent's 503), or gone (404: its deployment or adapter was deleted after the
# branch was chosen, or its agent no longer runs it). Nothing ran for any of them. A gone branch's request goes to
# another live branch first (retry_branch), so deleting a branch mid-traffic loses none.
FALLBACK_STATUSES = frozenset({404, 429, 503})
GONE = 404


@dataclass(frozen=True)
class BranchView:
    deployment: str
    adapter: str | None
    weight: int

    @property
    def model(self) -> str:
        """The name a request to this branch carries: the adapter's own, else the deployment's."""
        return self.adapter or self.deployment

    @property
    def target(self) -> str:
        """`deployment` or `deployment/adapter`, as the x-modelgrid-route header names it."""
        return f"{self.deployment}/{self.adapter}" if self.adapter else self.deployment


@dataclass(frozen=True)
class RouteView:
    name: str
    branches: tuple[BranchView, ...]
    fallback: str | None = None
    created: int = 0
    team: int = 0  # the owning team's id: only its members' tokens (and admins') see and call it
    bounds: tuple[int, ...] = field(init=False, repr=False, compare=False)  # running sums of the weights

    def __post_init__(self) -> None:
        object.__setattr__(self, "bounds", tuple(itertools.accumulate(b.weight for b in self.branches)))

    def choose(self, draw: float) -> BranchView | None:
        """The branch for a uniform `draw` in [0, 1): each with its weight's share of draws; None without branches."""
        if not self.branches:
            return None
        return self.branches[bisect.bisect_right(self.bounds, draw * self.bounds[-1])]


def retry_branch(route: RouteView, gone: BranchView, deployments: Collection[str], adapters: Mapping[str, str],
                 draw: float) -> BranchView | None:
    """The branch to send a request to once `gone` answered that its model is not there: another of `route`'s branches
    whose deployment (and adapter) the snapshot still holds, by weight for a uniform `draw`; None without one."""
    live = tuple(b for b in route.branches if b.target != gone.target and b.deployment in deployments
                 and (b.adapter is None or adapters.get(b.adapter) == b.deployment))
    return RouteView(route.name, live).choose(draw)


def load_routes() -> dict[str, RouteView]:
    """Every route with its branches and team, in two queries (sync; part of the fleet snapshot)."""
    branches: dict[int, list[BranchView]] = {}
    rows = Branch.objects.order_by("route_id", "position").values_list(
        "route_id", "deployment__name", "adapter__name", "weight")
    for route_id, deployment, adapter, weight in rows:
        branches.setdefault(route_id, []).append(BranchView(deployment, adapter, weight))
    return {name: RouteView(name, tuple(branches.get(pk, ())), fallback, int(created.timestamp()), team)
            for pk, name, fallback, created, team in Route.objects.values_list(
                "pk", "name", "fallback__name", "created", "team_id")}
