from ninja import Body, Router, Status

from console.catalog.schemas import ErrorOut
from console.deployments import services
from console.deployments.models import Deployment
from console.deployments.presenters import deployment_data
from console.deployments.schemas import DeploymentIn, DeploymentOut, DeploymentPatch
from console.errors import Invalid
from console.scheduler.dryrun import PlanInputError, run_dry_plan

router = Router()


@router.get("", response=list[DeploymentOut])
def list_deployments(request):
    return [deployment_data(d) for d in Deployment.objects.select_related("model")]


@router.post("", response={201: DeploymentOut, 409: ErrorOut, 422: ErrorOut}, summary="Deploy a registered model")
def create_deployment(request, body: DeploymentIn):
    policy = body.dict(include=set(services.POLICY_FIELDS), exclude_unset=True)
    dep = services.create_deployment(body.name, body.model, dtype=body.dtype, batch=body.batch, seq=body.seq,
                                     **policy)
    return Status(201, deployment_data(dep))


@router.get("/{name}", response={200: DeploymentOut, 404: ErrorOut})
def get_deployment(request, name: str):
    return deployment_data(services.get_deployment(name))


@router.patch("/{name}", response={200: DeploymentOut, 404: ErrorOut, 422: ErrorOut},
              summary="Change a deployment's replicas, priority, SLO or placement constraints")
def update_deployment(request, name: str, body: DeploymentPatch):
    return deployment_data(services.update_deployment(name, body.dict(exclude_unset=True)))


@router.delete("/{name}", response={204: None, 404: ErrorOut})
def delete_deployment(request, name: str):
    services.delete_deployment(name)
    return Status(204, None)


plan_router = Router()


@plan_router.post("", response={200: dict, 422: ErrorOut},
                  summary="Dry run: plan a described fleet (nothing is stored; format in docs/placement.md)")
def dry_plan(request, doc: dict = Body(...), strategy: str | None = None):
    """The same planner as the scheduler loop, on the GPUs and deployments in the body."""
    try:
        return run_dry_plan(doc, strategy)
    except PlanInputError as e:
        raise Invalid(str(e)) from None
