from ninja import Router

from console.fleet.presenters import fleet
from console.fleet.schemas import HostOut

router = Router()


@router.get("", response=list[HostOut], summary="Hosts, their GPUs and the replicas on each GPU")
def list_hosts(request):
    return fleet()
