from typing import Literal

from django.http import HttpResponse
from ninja import Field, Query, Router

from console.catalog.schemas import ErrorOut
from console.fleet.models import Host
from console.fleet.presenters import fleet, in_state
from console.fleet.schemas import HostOut
from console.pagination import ListQuery, name_search, paginate, set_page_headers

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
    return fleet(window)
