"""The single NinjaAPI of the project: one router per app, domain errors mapped once."""

from ninja import NinjaAPI
from ninja.security import django_auth

from console.accounts.auth import BearerToken
from console.catalog.api import adapter_router, estimate_router
from console.catalog.api import router as catalog_router
from console.deployments.api import plan_router
from console.deployments.api import router as deployments_router
from console.errors import DomainError
from console.fleet.api import router as fleet_router

api = NinjaAPI(
    title="ModelGrid API",
    version="1",
    urls_namespace="api-v1",
    docs_url="/docs",
    auth=[BearerToken(), django_auth],
    description="Register models, deploy them onto the GPU fleet, and watch placement. "
    "Authenticate with `Authorization: Bearer <token>` (`python manage.py createapitoken USER`); a token made "
    "with `--scope inference` may only call the inference gateway, and is refused here with 403.",
)
api.add_router("/hosts", fleet_router, tags=["fleet"])
api.add_router("/models", catalog_router, tags=["models"])
api.add_router("/deployments", deployments_router, tags=["deployments"])
api.add_router("/adapters", adapter_router, tags=["adapters"])
api.add_router("/estimate", estimate_router, tags=["models"])
api.add_router("/plan", plan_router, tags=["deployments"])


@api.exception_handler(DomainError)
def domain_error(request, exc: DomainError):
    return api.create_response(request, {"detail": str(exc)}, status=exc.status)
