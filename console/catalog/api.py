from django.http import HttpResponse
from ninja import Query, Router, Status

from console.accounts.auth import actor_of
from console.accounts.teams import creation_team, scoped, teams_of
from console.catalog import adapters, services
from console.catalog.models import Adapter, Model
from console.catalog.schemas import (
    AdapterIn,
    AdapterOut,
    AdapterPatch,
    ErrorOut,
    EstimateIn,
    EstimateOut,
    ModelIn,
    ModelOut,
    ModelPatch,
)
from console.pagination import ListQuery, name_search, paginate, set_page_headers

router = Router()
estimate_router = Router()
adapter_router = Router()
ADAPTER_FIELDS = ("name", "path", "rank", "modules", "parameters", "nbytes", "pinned", "created", "deployment")


@router.get("", response={200: list[ModelOut], 422: ErrorOut},
            summary="Registered models, a page at a time (X-Total-Count and Link headers; filter with q)")
def list_models(request, response: HttpResponse, query: Query[ListQuery]):
    rows = scoped(Model.objects.select_related("team"), teams_of(request.user))
    page, window = paginate(name_search(rows, query.q), query.page, query.per_page)
    set_page_headers(response, request, page)
    return list(window)


@router.post("", response={201: ModelOut, 409: ErrorOut, 422: ErrorOut}, summary="Register a model directory")
def register_model(request, body: ModelIn):
    return Status(201, services.register_model(body.name, body.path, actor=actor_of(request),
                                               team=creation_team(request.user, body.team)))


@router.get("/{name}", response={200: ModelOut, 404: ErrorOut})
def get_model(request, name: str):
    return services.get_model(name, teams=teams_of(request.user))


@router.patch("/{name}", response={200: ModelOut, 404: ErrorOut, 422: ErrorOut},
              summary="Change a model's directory, or read its files again (its deployments' replicas roll onto a "
              "changed artifact one at a time, drained)")
def update_model(request, name: str, body: ModelPatch):
    if body.path is None:
        return services.get_model(name, teams=teams_of(request.user))
    return services.update_model(name, body.path, actor=actor_of(request), teams=teams_of(request.user))


@router.delete("/{name}", response={204: None, 404: ErrorOut, 409: ErrorOut})
def delete_model(request, name: str):
    services.delete_model(name, actor=actor_of(request), teams=teams_of(request.user))
    return Status(204, None)


@estimate_router.post("", response={200: EstimateOut, 404: ErrorOut, 422: ErrorOut},
                      summary="Estimate one replica's memory from headers and config (nothing is loaded or stored)")
def estimate(request, body: EstimateIn):
    return services.estimate_request(body.path, body.model, body.dtype, body.batch, body.seq, body.device,
                                   body.adapter_pool_bytes, teams=teams_of(request.user))


@adapter_router.get("", response={200: list[AdapterOut], 422: ErrorOut},
                    summary="Registered adapters, a page at a time (X-Total-Count and Link headers; filter with q)")
def list_adapters(request, response: HttpResponse, query: Query[ListQuery]):
    # Of its deployment an adapter shows only the name.
    rows = Adapter.objects.select_related("deployment", "team").only(*ADAPTER_FIELDS, "deployment__name", "team__name")
    rows = scoped(rows, teams_of(request.user))
    page, window = paginate(name_search(rows, query.q), query.page, query.per_page)
    set_page_headers(response, request, page)
    return list(window)


@adapter_router.post("", response={201: AdapterOut, 409: ErrorOut, 422: ErrorOut},
                     summary="Register a LoRA adapter on a deployment (checked against its base model)")
def register_adapter(request, body: AdapterIn):
    return Status(201, adapters.register_adapter(body.name, body.deployment, body.path, body.pinned,
                                                 actor=actor_of(request), teams=teams_of(request.user)))


@adapter_router.get("/{name}", response={200: AdapterOut, 404: ErrorOut})
def get_adapter(request, name: str):
    return adapters.get_adapter(name, teams_of(request.user))


@adapter_router.patch("/{name}", response={200: AdapterOut, 404: ErrorOut, 422: ErrorOut},
                      summary="Change an adapter's directory (or read it again) or its pin (a changed artifact rolls "
                      "its deployment's replicas onto it one at a time, drained)")
def update_adapter(request, name: str, body: AdapterPatch):
    changes = body.dict(exclude_none=True)
    return adapters.update_adapter(name, changes, actor=actor_of(request), teams=teams_of(request.user))


@adapter_router.delete("/{name}", response={204: None, 404: ErrorOut})
def delete_adapter(request, name: str):
    adapters.delete_adapter(name, actor=actor_of(request), teams=teams_of(request.user))
    return Status(204, None)
