"""The single NinjaAPI of the project: one router per app, every refusal mapped once to one error shape
(`{"detail": [{"loc", "msg", "type"}]}`), whatever raised it."""

import json
import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import django_auth

from console.accounts.api import agent_router as agent_credentials_router
from console.accounts.api import router as tokens_router
from console.accounts.api import team_router
from console.accounts.auth import BearerToken
from console.alerts.api import router as alerts_router
from console.catalog.api import adapter_router, estimate_router
from console.catalog.api import router as catalog_router
from console.deployments.api import plan_router
from console.deployments.api import router as deployments_router
from console.errors import DomainError, pydantic_items
from console.events.api import audit_router
from console.events.api import router as events_router
from console.fleet.api import router as fleet_router
from console.fleet.api import scheduler_router
from console.routes.api import router as routes_router
from console.series.api import deployment_router as deployment_series_router
from console.series.api import host_router as host_series_router
from console.usage.api import csv_router as usage_csv_router
from console.usage.api import router as usage_router


class BodyRefused(Exception):
    """A request body that is JSON to Python but not to us; ninja wraps it in its 400, the handler unwraps it."""


def _not_json(name: str):
    raise BodyRefused(f"request body: {name} is not a JSON number (numbers must be finite)")


class StrictJsonParser(Parser):
    """What Python's json module accepts beyond JSON (NaN, Infinity) or cannot read (an integer past 4,300
    digits, nesting past the recursion limit) is a 400 that says which. Range checks are the schemas'."""

    def parse_body(self, request):
        try:
            return json.loads(request.body, parse_constant=_not_json)
        except RecursionError:
            raise BodyRefused("request body: nested too deeply") from None
        except UnicodeDecodeError as e:
            raise BodyRefused(f"request body: not UTF-8 ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise BodyRefused(f"request body: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        except ValueError as e:  # int() past sys.get_int_max_str_digits()
            raise BodyRefused(f"request body: {e}") from None


# Refusals any operation can give, documented on each so clients (and schemathesis) can expect them.
_EVERY_OPERATION = {401: "no valid bearer token or session, or a token that expired or was revoked (the message "
                    "says when)", 403: "a token of another scope (inference)"}
_WITH_BODY = {400: "the body is not acceptable JSON (malformed, too deep, a huge integer, NaN)",
              413: "the body is larger than the API's limit (DATA_UPLOAD_MAX_MEMORY_SIZE); nothing was stored",
              422: "a field is invalid; each item names it"}


class ModelGridAPI(NinjaAPI):
    def get_openapi_schema(self, *args, **kwargs):
        schema = super().get_openapi_schema(*args, **kwargs)
        for operations in schema["paths"].values():
            for operation in operations.values():
                extra = _EVERY_OPERATION | (_WITH_BODY if "requestBody" in operation else {})
                for status, why in extra.items():
                    operation["responses"].setdefault(status, {"description": why, "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}})
        return schema


api = ModelGridAPI(
    parser=StrictJsonParser(),
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
api.add_router("/routes", routes_router, tags=["routes"])
api.add_router("/estimate", estimate_router, tags=["models"])
api.add_router("/plan", plan_router, tags=["deployments"])
api.add_router("/scheduler", scheduler_router, tags=["fleet"])
api.add_router("/events", events_router, tags=["events"])
api.add_router("/audit", audit_router, tags=["events"])
api.add_router("/alerts", alerts_router, tags=["events"])
api.add_router("/tokens", tokens_router, tags=["tokens"])
api.add_router("/agent-credentials", agent_credentials_router, tags=["tokens"])
api.add_router("/teams", team_router, tags=["teams"])
api.add_router("/usage", usage_router, tags=["usage"])
api.add_router("/usage.csv", usage_csv_router, tags=["usage"])
# Series live under their objects' paths (/deployments/{name}/series, /hosts/{name}/series).
api.add_router("/deployments", deployment_series_router, tags=["deployments"])
api.add_router("/hosts", host_series_router, tags=["fleet"])


log = logging.getLogger("modelgrid.api")
_HTTP_TYPES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 429: "throttled"}


def _refusal(request, status: int, items: list[dict]):
    return api.create_response(request, {"detail": items}, status=status)


@api.exception_handler(DomainError)
def domain_error(request, exc: DomainError):
    return _refusal(request, exc.status, exc.errors)


@api.exception_handler(ValidationError)
def validation_error(request, exc: ValidationError):
    # ninja nests a body model under its parameter name (["body", "body", "replicas"]); name the field as
    # the services do.
    errors = []
    for e in exc.errors:
        loc = list(e.get("loc", ()))
        if len(loc) > 2 and loc[0] == "body" and loc[1] in ("body", "doc"):
            del loc[1]
        errors.append(e | {"loc": loc})
    return _refusal(request, 422, pydantic_items(errors))


@api.exception_handler(HttpError)
def http_error(request, exc: HttpError):
    if isinstance(exc.__cause__, BodyRefused):
        return _refusal(request, 400, [{"loc": ["body"], "msg": str(exc.__cause__), "type": "invalid_json"}])
    return _refusal(request, exc.status_code,
                    [{"loc": [], "msg": str(exc), "type": _HTTP_TYPES.get(exc.status_code, "http_error")}])


@api.exception_handler(RequestDataTooBig)
def too_large(request, exc: RequestDataTooBig):
    # Django raises it when the body is first read (ninja's parsing, before the view): a client's error, not a 500.
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return _refusal(request, 413, [{"loc": ["body"], "msg": f"request body is larger than the API's limit of "
                                    f"{limit:,} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)", "type": "request_too_large"}])


@api.exception_handler(Http404)
def not_found(request, exc: Http404):
    return _refusal(request, 404, [{"loc": [], "msg": str(exc) or "not found", "type": "not_found"}])


@api.exception_handler(Exception)
def server_error(request, exc: Exception):
    # Never an HTML page or a silent 500: the traceback goes to the log, the client gets the API's shape.
    log.error("%s %s failed", request.method, request.path, exc_info=exc)
    return _refusal(request, 500, [{"loc": [], "msg": "internal error: the console logged it", "type": "server_error"}])
