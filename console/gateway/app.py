"""The front door: OpenAI-compatible /v1 and Open Inference Protocol /v2 for every deployment in the fleet,
plus the console's /metrics and the agents' relayed (agent_metrics.py). Served by the console's own ASGI
process (console/asgi.py routes these paths here).

Listing models, the v2 repository index, readiness and health are answered here from the gateway's snapshot of
the fleet; inference, model metadata and Triton's model configuration go to a replica (proxy.py). Every answer
from a replica names it (`x-modelgrid-replica`) and the time spent waiting for one (`x-modelgrid-queue-ms`).
Every error, the gateway's own 404, 405 and 500 included, is JSON in the shape of the path's API family
(errors.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.protocol import TRITON_EXTENSIONS
from console import __version__
from console.dbthreads import own_thread
from console.deployments.serving import SERVING_HINTS
from console.gateway import agent_metrics
from console.gateway.auth import Caller, bearer, unauthorized
from console.gateway.core import Gateway, Refused
from console.gateway.errors import OPENAI, V2, Family, family_of, http_error, server_error
from console.gateway.fleet import DeploymentView, FleetView
from console.gateway.fleet_metrics import scrape
from console.gateway.metrics import CONTENT_TYPE
from console.gateway.metrics_scope import scoped, visible
from console.gateway.proxy import permitted, proxy, resolve, visible_route
from console.gateway.routes import RouteView
from console.gateway.triton import check_version, not_loaded_on_request, repository_index


def make_app(gateway: Gateway | None = None) -> Starlette:
    """The gateway's ASGI app over `gateway` (one per process; tests pass their own)."""
    gw = gateway or Gateway()
    app = Starlette(routes=[
        Route("/v1/models", _wrap(gw, OPENAI, _list_models), methods=["GET"]),
        Route("/v1/models/{name:path}", _wrap(gw, OPENAI, _get_model), methods=["GET"]),
        Route("/v1/completions", _proxied(gw, OPENAI), methods=["POST"]),
        Route("/v1/chat/completions", _proxied(gw, OPENAI), methods=["POST"]),
        Route("/v1/embeddings", _proxied(gw, OPENAI), methods=["POST"]),
        Route("/v1/responses", _proxied(gw, OPENAI), methods=["POST"]),  # vLLM's, as /tokenize and /detokenize
        Route("/tokenize", _proxied(gw, OPENAI), methods=["POST"]),
        Route("/detokenize", _proxied(gw, OPENAI), methods=["POST"]),
        Route("/health", _ready(gw), methods=["GET"]),  # where vLLM's and other OpenAI servers' clients look
        Route("/v2/health/live", _live, methods=["GET"]),
        Route("/v2/health/ready", _ready(gw), methods=["GET"]),
        Route("/v2", _wrap(gw, V2, _server_metadata), methods=["GET"]),
        Route("/v2/repository/index", _wrap(gw, V2, repository_index), methods=["POST"]),
        Route("/v2/repository/models/{name}/{verb:str}", _wrap(gw, V2, not_loaded_on_request), methods=["POST"]),
        *(route for model in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}") for route in (
            Route(model, _proxied(gw, V2), methods=["GET"]),
            Route(f"{model}/ready", _wrap(gw, V2, _model_ready), methods=["GET"]),
            Route(f"{model}/config", _proxied(gw, V2), methods=["GET"]),  # Triton's model configuration
            Route(f"{model}/infer", _proxied(gw, V2), methods=["POST"]),
        )),
        Route("/metrics", _wrap(gw, V2, _fleet_wide(_metrics)), methods=["GET"]),
        Route("/metrics/agents", _wrap(gw, V2, _fleet_wide(agent_metrics.targets)), methods=["GET"]),
        Route("/metrics/agents/{name}", _wrap(gw, V2, _fleet_wide(agent_metrics.relay)), methods=["GET"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.gateway = gw
    return app


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return http_error(family_of(request.url.path), request.method, request.url.path, exc.status_code, exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    return server_error(family_of(request.url.path), request.method, request.url.path, exc)


# --- requests answered by the gateway itself -------------------------------------------------------------

def _proxied(gw: Gateway, family: Family):
    async def endpoint(request: Request) -> Response:
        return await proxy(gw, request, family)

    return endpoint


def _wrap(gw: Gateway, family: Family, handler):
    async def endpoint(request: Request) -> Response:
        await gw.ensure_started()
        request.state.caller = caller = await _caller(gw, request)
        if refused := unauthorized(caller, datetime.now(UTC)):
            return family.error(401, refused, "invalid_api_key")
        try:
            return await handler(gw, request)
        except Refused as e:
            return family.error(e.status, str(e), e.code, e.retry_after)

    return endpoint


def _fleet_wide(handler):
    """What names every deployment (the metrics) is refused to a token limited to some of them (403)."""
    async def endpoint(gw: Gateway, request: Request) -> Response:
        if request.state.caller.deployments:
            raise Refused(403, "the fleet's metrics name every deployment; this token is limited to deployments "
                          f"({', '.join(sorted(request.state.caller.deployments))}): use a token without that limit",
                          code="permission_denied")
        return await handler(gw, request)

    return endpoint


async def _caller(gw: Gateway, request: Request) -> Caller | None:
    return await gw.authenticate(bearer(request.headers.get("authorization")))


def _card(dep: DeploymentView, name: str | None = None) -> dict:
    card = {"id": name or dep.name, "object": "model", "created": dep.created, "owned_by": "modelgrid",
            "state": dep.serving, "tier": dep.tier, "task": dep.task}
    if name is not None and name != dep.name:
        card["parent"] = dep.name
    return card


async def _list_models(gw: Gateway, request: Request) -> Response:
    fleet, caller = gw.fleet, request.state.caller
    callable_ = [d for d in fleet.deployments.values() if caller.in_team(d.team) and caller.may_call(d.name)]
    data = [_card(d) for d in callable_]
    names = {d.name for d in callable_}
    data += [_card(fleet.deployments[d], a) for a, d in sorted(fleet.adapters.items()) if d in names]
    data += [_route_card(r, fleet) for r in fleet.routes.values() if _visible(r, fleet, caller)]
    return JSONResponse({"object": "list", "data": data})


def _visible(route: RouteView, fleet: FleetView, caller: Caller) -> bool:
    """Whether `caller` may see and call `route`: it may call one of its branches' deployments."""
    return visible_route(caller, route, fleet)


def _route(gw: Gateway, request: Request) -> RouteView | None:
    """The route the path names, if the caller may see it (else None: the name answers as unknown)."""
    route = gw.fleet.routes.get(request.path_params["name"])
    return route if route is not None and _visible(route, gw.fleet, request.state.caller) else None


def _route_card(route: RouteView, fleet: FleetView) -> dict:
    """A route as a model: its state and task are its heaviest branch's deployment's."""
    card = {"id": route.name, "object": "model", "created": route.created, "owned_by": "modelgrid",
            "route": [{"deployment": b.deployment, "adapter": b.adapter, "weight": b.weight} for b in route.branches],
            "fallback": route.fallback}
    dep = fleet.deployments.get(max(route.branches, key=lambda b: b.weight).deployment) if route.branches else None
    if dep is not None:
        card |= {"state": dep.serving, "tier": dep.tier, "task": dep.task}
    return card


async def _get_model(gw: Gateway, request: Request) -> Response:
    if (route := _route(gw, request)) is not None:
        return JSONResponse(_route_card(route, gw.fleet))
    dep, adapter = resolve(gw.fleet, request.path_params["name"])
    permitted(request.state.caller, dep, request.path_params["name"])
    return JSONResponse(_card(dep, adapter))


async def _server_metadata(gw: Gateway, request: Request) -> Response:
    return JSONResponse({"name": "modelgrid", "version": __version__, "extensions": list(TRITON_EXTENSIONS)})


async def _model_ready(gw: Gateway, request: Request) -> Response:
    if (route := _route(gw, request)) is not None:  # ready when a branch or its fallback is
        check_version(request)
        names = [b.deployment for b in route.branches] + [route.fallback] * bool(route.fallback)
        if any(gw.fleet.deployments[n].ready for n in names if n in gw.fleet.deployments):
            return JSONResponse({"name": route.name, "ready": True})
        raise Refused(503, f"route {route.name!r}: none of its deployments ({', '.join(names)}) has a ready "
                      "replica", code="model_not_ready")
    dep, _ = resolve(gw.fleet, request.path_params["name"])
    check_version(request)
    permitted(request.state.caller, dep, request.path_params["name"])
    if dep.ready:
        return JSONResponse({"name": request.path_params["name"], "ready": True})
    raise Refused(503, f"model {dep.name!r} is {dep.serving}: {SERVING_HINTS[dep.serving]}", code="model_not_ready")


async def _metrics(gw: Gateway, request: Request) -> Response:
    # Read and rendered off the loop: at 10,000 deployments the body is tens of thousands of lines.
    names = visible(request.state.caller, gw.fleet)  # None: an admin's token, which reads every team's series

    def page() -> bytes:  # usage per token names every team's people: admins' only
        return scoped(scrape(gw.metrics, names is None), names)

    return Response(await own_thread(page)(), headers={"Content-Type": CONTENT_TYPE})


async def _live(request: Request) -> Response:
    return JSONResponse({"live": True})


def _ready(gw: Gateway):
    async def ready(request: Request) -> Response:
        try:
            await gw.ensure_started()
        except Exception as e:  # the database is unreachable: this console cannot route
            return V2.error(503, f"not ready: cannot read the fleet ({type(e).__name__})")
        return JSONResponse({"ready": True})

    return ready


