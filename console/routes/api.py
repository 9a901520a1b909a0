from ninja import Router, Status

from console.accounts.auth import actor_of
from console.accounts.teams import creation_team, scoped, teams_of
from console.catalog.schemas import ErrorOut
from console.routes import services
from console.routes.models import Route
from console.routes.schemas import RouteIn, RouteOut, RoutePatch

router = Router()


def route_data(route: Route) -> dict:
    branches = list(route.branches.select_related("deployment", "adapter"))
    total = sum(b.weight for b in branches) or 1
    return {"name": route.name, "team": route.team.name, "fallback": route.fallback.name if route.fallback_id else None,
            "created": route.created, "updated": route.updated,
            "branches": [{"deployment": b.deployment.name, "adapter": b.adapter.name if b.adapter_id else None,
                          "weight": b.weight, "share": round(b.weight / total, 6)} for b in branches]}


@router.get("", response={200: list[RouteOut]},
            summary="Routes: public model names sent to deployments by weight (your teams', or all for admins)")
def list_routes(request):
    rows = scoped(Route.objects.select_related("fallback", "team"), teams_of(request.user))
    return [route_data(r) for r in rows.prefetch_related("branches__deployment", "branches__adapter")]


@router.post("", response={201: RouteOut, 409: ErrorOut, 422: ErrorOut},
             summary="Create a route (a canary split, an alias, an adapter under its own public name)")
def create_route(request, body: RouteIn):
    team = creation_team(request.user, body.team) if body.team else None  # else its first branch's
    route = services.create_route(body.name, [b.dict() for b in body.branches], body.fallback,
                                  actor=actor_of(request), team=team, teams=teams_of(request.user))
    return Status(201, route_data(route))


@router.get("/{name}", response={200: RouteOut, 404: ErrorOut})
def get_route(request, name: str):
    return route_data(services.get_route(name, teams_of(request.user)))


@router.patch("/{name}", response={200: RouteOut, 404: ErrorOut, 422: ErrorOut},
              summary="Change a route's branches or fallback; traffic moves without a restart")
def update_route(request, name: str, body: RoutePatch):
    changes = body.dict(exclude_unset=True)
    if changes.get("branches") is not None:
        changes["branches"] = [dict(b) for b in changes["branches"]]
    return route_data(services.update_route(name, changes, actor=actor_of(request), teams=teams_of(request.user)))


@router.delete("/{name}", response={204: None, 404: ErrorOut})
def delete_route(request, name: str):
    services.delete_route(name, actor=actor_of(request), teams=teams_of(request.user))
    return Status(204, None)
