from asgiref.sync import sync_to_async
from django.http import HttpResponse
from ninja import Body, Path, Query, Router, Status

from console.accounts.auth import actor_of
from console.accounts.teams import creation_team, scoped, teams_of
from console.catalog.schemas import ErrorOut
from console.catalog.sizing import sized
from console.deployments import services
from console.deployments.models import Deployment
from console.deployments.presenters import deployment_data, deployments_data, listed
from console.deployments.schemas import (
    DeploymentBulkIn,
    DeploymentIn,
    DeploymentListQuery,
    DeploymentOut,
    DeploymentPatch,
    ReplicaLogsOut,
    ReplicaLogsQuery,
)
from console.errors import Invalid
from console.fleet.logs import replica_logs
from console.pagination import name_search, paginate, set_page_headers
from console.scheduler.dryrun import PlanInputError, run_dry_plan

router = Router()
SERVING_SHAPE = {"name", *services.SERVING_FIELDS}  # what a deployment is made of, beside its policy


@router.get("", response={200: list[DeploymentOut], 422: ErrorOut},
            summary="Deployments, a page at a time (X-Total-Count and Link headers; filter with q and state)")
def list_deployments(request, response: HttpResponse, query: Query[DeploymentListQuery]):
    rows = name_search(scoped(Deployment.objects.all(), teams_of(request.user)), query.q)
    if query.state:
        rows = rows.filter(state=query.state)
    page, window = paginate(listed(rows), query.page, query.per_page)
    set_page_headers(response, request, page)
    return deployments_data(window)


@router.post("", response={201: DeploymentOut, 409: ErrorOut, 422: ErrorOut}, summary="Deploy a registered model")
def create_deployment(request, body: DeploymentIn):
    policy = body.dict(include=set(services.POLICY_FIELDS), exclude_unset=True)
    dep = services.create_deployment(body.name, body.model, dtype=body.dtype, batch=body.batch, seq=body.seq,
                                     actor=actor_of(request), team=_team(request, body.team),
                                     teams=teams_of(request.user), **policy)
    return Status(201, deployment_data(dep, fresh=True))


@router.post("/bulk", response={201: list[DeploymentOut], 409: ErrorOut, 422: ErrorOut},
             summary="Deploy many registered models in one request: all of them, or none when any is refused")
def create_deployments(request, body: DeploymentBulkIn):
    items = [d.dict(include=SERVING_SHAPE) | d.dict(include=set(services.POLICY_FIELDS), exclude_unset=True)
             for d in body.deployments]
    for index, d in enumerate(body.deployments):
        if d.team is not None:
            raise Invalid("team: give it once, beside deployments, for all of them", field="team",
                          errors=[{"loc": ["body", "deployments", index, "team"], "type": Invalid.type,
                                   "msg": "team: give it once, beside deployments, for all of them"}])
    created = services.create_deployments(items, actor=actor_of(request), team=_team(request, body.team),
                                          teams=teams_of(request.user))
    # As created, in request order, not read back: what a read would add (replicas, adapters) a new deployment has
    # none of, and reading a thousand back cost a quarter to a third of the request (bench/create_cost.py), on a console
    # thread that a wave's pushes and acks wait for (the interpreter lock).
    return Status(201, [deployment_data(d, fresh=True) for d in created])


def _team(request, name: str | None):
    """The team named in the body (one of the requester's); None: the model's team (one they can see)."""
    return creation_team(request.user, name) if name else None


# "bulk" is also a valid deployment name (a batch-tier deployment is often called that), and Django routes
# /deployments/bulk here whatever the method: these keep such a deployment readable, changeable and deletable,
# and are documented, so the methods the path allows are the methods its schema names.
@router.get("/bulk", response={200: DeploymentOut, 404: ErrorOut}, summary="The deployment named bulk")
def get_deployment_named_bulk(request):
    return get_deployment(request, "bulk")


@router.patch("/bulk", response={200: DeploymentOut, 404: ErrorOut, 422: ErrorOut},
              summary="Change the deployment named bulk")
def update_deployment_named_bulk(request, body: DeploymentPatch):
    return update_deployment(request, "bulk", body)


@router.delete("/bulk", response={204: None, 404: ErrorOut}, summary="Delete the deployment named bulk")
def delete_deployment_named_bulk(request):
    return delete_deployment(request, "bulk")


@router.get("/{name}", response={200: DeploymentOut, 404: ErrorOut})
def get_deployment(request, name: str):
    return deployment_data(services.get_deployment(name, teams=teams_of(request.user)))


@router.patch("/{name}", response={200: DeploymentOut, 404: ErrorOut, 422: ErrorOut},
              summary="Change a deployment's replicas, priority, SLO or placement constraints")
def update_deployment(request, name: str, body: DeploymentPatch):
    return deployment_data(services.update_deployment(name, body.dict(exclude_unset=True), actor=actor_of(request),
                                                      teams=teams_of(request.user)))


@router.delete("/{name}", response={204: None, 404: ErrorOut})
def delete_deployment(request, name: str):
    services.delete_deployment(name, actor=actor_of(request), teams=teams_of(request.user))
    return Status(204, None)


# Async: the answer waits up to 5 s for the replica's agent, which a sync view would spend holding the one thread
# that every sync view shares under ASGI. Auth still works: ninja runs the sync authenticators in a thread.
@router.get("/{name}/replicas/{index}/logs",
            response={200: ReplicaLogsOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut, 502: ErrorOut, 503: ErrorOut,
                      504: ErrorOut},
            summary="The last lines a replica's workers wrote (stdout and stderr), read from its host's agent")
async def get_replica_logs(request, name: str, query: Query[ReplicaLogsQuery],
                           index: int = Path(..., ge=0, le=2**31 - 1)):
    """404: no such deployment or replica (`index` as in the deployment's `replicas`); 409: not placed on a host;
    503: its host's agent is not connected; 502: the agent refused (its words); 504: the agent did not answer."""
    await sync_to_async(lambda: services.get_deployment(name, teams=teams_of(request.user)))()  # yours, or 404
    return {"lines": await replica_logs(name, index, query.tail)}


plan_router = Router()


@plan_router.post("", response={200: dict, 422: ErrorOut},
                  summary="Dry run: plan a described fleet (nothing is stored; format in docs/placement.md)")
def dry_plan(request, doc: dict = Body(...), strategy: str | None = None):
    """The same planner as the scheduler loop, on the GPUs and deployments in the body; a deployment may name its
    `model` (registered, or a directory in the model roots) instead of giving `bytes`."""
    try:
        return run_dry_plan(sized(doc), strategy)
    except PlanInputError as e:
        raise Invalid(str(e)) from None
