from typing import Literal

from django.http import HttpResponse
from ninja import Field, Query, Router, Schema

from console.accounts.auth import actor_of
from console.accounts.scope import TeamScope
from console.catalog.schemas import ErrorOut
from console.errors import NotFound
from console.fleet.models import Host, PlacementSettings
from console.fleet.presenters import fleet, in_state
from console.fleet.schemas import HostOut
from console.fleet.services import HostPlacement, set_placement, set_strategy
from console.pagination import ListQuery, name_search, paginate, set_page_headers
from console.scheduler import STRATEGIES

router = Router()


class HostListQuery(ListQuery):
    state: Literal["connected", "unknown", "offline"] | None = Field(
        None, description="connected; unknown: lease lapsed, replicas kept; offline: evicted")


@router.get("", response={200: list[HostOut], 422: ErrorOut},
            summary="Hosts, their GPUs and the replicas on each GPU, a page at a time (X-Total-Count and Link "
            "headers; filter with q and state)")
def list_hosts(request, response: HttpResponse, query: Query[HostListQuery]):
    rows = name_search(Host.objects.all(), query.q)
    if query.state:
        rows = in_state(rows, query.state)
    page, window = paginate(rows, query.page, query.per_page)
    set_page_headers(response, request, page)
    return fleet(window, TeamScope.of(request.user))


@router.get("/{name}", response={200: HostOut, 404: ErrorOut}, summary="One host, its GPUs and their replicas")
def get_host(request, name: str):
    found = fleet(Host.named(name), TeamScope.of(request.user))
    if not found:
        raise NotFound(f"no host named {name!r}")
    return found[0]


@router.patch("/{name}", response={200: HostOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut},
              summary="Set a host's labels and/or taints (each given one replaced whole)")
def patch_host(request, name: str, body: HostPlacement):
    set_placement(request.user, name, body.model_dump(exclude_unset=True), actor=actor_of(request))
    return fleet(Host.named(name), TeamScope.of(request.user))[0]


scheduler_router = Router()


class StrategyOut(Schema):
    strategy: str = Field(description="what the scheduler places replicas with (docs/placement.md)")
    set_at_run_time: bool = Field(description="set with PATCH (else it is MODELGRID_STRATEGY's)")
    strategies: list[str]


class StrategyIn(Schema):
    strategy: str


def _strategy() -> dict:
    strategy, set_at_run_time = PlacementSettings.strategy_now()
    return {"strategy": strategy, "set_at_run_time": set_at_run_time, "strategies": list(STRATEGIES)}


@scheduler_router.get("", response={200: StrategyOut}, summary="The placement strategy")
def get_strategy(request):
    return _strategy()


@scheduler_router.patch("", response={200: StrategyOut, 403: ErrorOut, 422: ErrorOut},
                        summary="Change the placement strategy: new placements follow it from the next pass")
def patch_strategy(request, body: StrategyIn):
    set_strategy(request.user, body.strategy, actor=actor_of(request))
    return _strategy()
