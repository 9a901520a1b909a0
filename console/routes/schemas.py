from __future__ import annotations

from datetime import datetime

from ninja import Field, Schema

from console.catalog.schemas import RequestBody, name_field
from console.routes.models import MAX_BRANCHES, MAX_WEIGHT


class BranchIn(RequestBody):
    deployment: str = Field(max_length=63, description="the deployment this branch sends requests to")
    weight: int = Field(1, ge=1, le=MAX_WEIGHT, description="its share of the route's requests is weight / the "
                        "sum of the branches' weights (95 and 5: a 5% canary)")
    adapter: str | None = Field(None, max_length=63, description="one of the deployment's adapters to serve "
                                "the requests with; default: the base model")


class RouteIn(RequestBody):
    name: str = name_field("route")
    branches: list[BranchIn] = Field(max_length=MAX_BRANCHES, description="where requests go, by weight "
                                     f"(1 to {MAX_BRANCHES} branches)")
    fallback: str | None = Field(None, max_length=63, description="a deployment that takes a request once when "
                                 "its branch is refused (unschedulable, no replica in time) or overloaded (429, 503)")
    team: str | None = Field(None, max_length=63, description="the team that owns it (one of yours; any for "
                             "admins); default: its first branch's deployment's team. Its branches and fallback "
                             "must be deployments of that team")


class RoutePatch(RequestBody):
    branches: list[BranchIn] | None = Field(None, max_length=MAX_BRANCHES, description="replaces every branch")
    fallback: str | None = Field(None, max_length=63, description="null removes the fallback")


class BranchOut(Schema):
    deployment: str
    adapter: str | None
    weight: int
    share: float = Field(description="weight / the sum of the route's weights")


class RouteOut(Schema):
    name: str
    team: str = Field(description="the team that owns it: only its members' tokens see and call it")
    branches: list[BranchOut]
    fallback: str | None
    created: datetime
    updated: datetime
