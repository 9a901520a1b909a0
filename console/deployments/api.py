from ninja import Router, Status

from console.catalog.schemas import ErrorOut
from console.deployments import services
from console.deployments.models import Deployment
from console.deployments.presenters import deployment_data
from console.deployments.schemas import DeploymentIn, DeploymentOut, DeploymentPatch

router = Router()


@router.get("", response=list[DeploymentOut])
def list_deployments(request):
    return [deployment_data(d) for d in Deployment.objects.select_related("model")]


@router.post("", response={201: DeploymentOut, 409: ErrorOut, 422: ErrorOut}, summary="Deploy a registered model")
def create_deployment(request, body: DeploymentIn):
    dep = services.create_deployment(body.name, body.model, body.replicas, body.priority, dtype=body.dtype,
                                     batch=body.batch, seq=body.seq)
    return Status(201, deployment_data(dep))


@router.get("/{name}", response={200: DeploymentOut, 404: ErrorOut})
def get_deployment(request, name: str):
    return deployment_data(services.get_deployment(name))


@router.patch("/{name}", response={200: DeploymentOut, 404: ErrorOut, 422: ErrorOut}, summary="Scale a deployment")
def scale_deployment(request, name: str, body: DeploymentPatch):
    return deployment_data(services.scale_deployment(name, body.replicas))


@router.delete("/{name}", response={204: None, 404: ErrorOut})
def delete_deployment(request, name: str):
    services.delete_deployment(name)
    return Status(204, None)
