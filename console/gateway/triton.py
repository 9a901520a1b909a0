"""Triton's repository index over the gateway's snapshot of the fleet, and the one version each model has
(agent.protocol.MODEL_VERSION). Model configurations come from a replica's agent (agent.serving.triton)."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agent.protocol import MODEL_VERSION, unknown_version
from console.deployments.serving import ASLEEP, BLOCKED, COLD, READY, REFUSED, SERVING_HINTS, STANDBY, WAKING
from console.gateway.core import Gateway, Refused
from console.gateway.fleet import DeploymentView

MAX_INDEX_BODY = 4096  # an index request is {"ready": true} at most

# A deployment's serving word as Triton's model states: READY serves, LOADING is on its way to a GPU, UNAVAILABLE
# does not serve now (the reason says what a request to it will get).
TRITON_STATES = {READY: "READY", WAKING: "LOADING", ASLEEP: "UNAVAILABLE", COLD: "UNAVAILABLE",
                 STANDBY: "UNAVAILABLE", BLOCKED: "UNAVAILABLE"}


def check_version(request: Request) -> None:
    """Refuse (404) a path naming a version other than the one each model has."""
    version = request.path_params.get("version")  # only the v2 model paths have one
    refused = unknown_version(request.path_params["name"], version) if version is not None else None
    if refused is not None:
        raise Refused(404, refused, code="model_not_found")


def index_entry(name: str, dep: DeploymentView) -> dict:
    """One model (a deployment, or an adapter's own name) as Triton's index lists it."""
    state = TRITON_STATES.get(dep.serving, "UNAVAILABLE")
    reason = "" if state == "READY" else f"{dep.serving}: {SERVING_HINTS.get(dep.serving, '')}".rstrip(": ")
    if state != "READY" and dep.demand_status in REFUSED and dep.demand_reason:
        reason = f"{dep.serving}: the scheduler cannot serve it now: {dep.demand_reason}"
    return {"name": name, "version": MODEL_VERSION, "state": state, "reason": reason}


async def repository_index(gw: Gateway, request: Request) -> Response:
    """POST /v2/repository/index: every model the caller may call, as /v1/models lists them, with its state;
    {"ready": true} for the ready ones only."""
    only_ready = await _ready_only(request)
    fleet, caller = gw.fleet, request.state.caller
    names = [(d.name, d) for d in fleet.deployments.values()]
    names += [(a, fleet.deployments[d]) for a, d in fleet.adapters.items() if d in fleet.deployments]
    entries = sorted((index_entry(name, dep) for name, dep in names
                      if caller.in_team(dep.team) and caller.may_call(dep.name)),
                     key=lambda e: e["name"])
    return JSONResponse([e for e in entries if e["state"] == "READY" or not only_ready])


async def not_loaded_on_request(gw: Gateway, request: Request) -> Response:
    """POST /v2/repository/models/{name}/load and /unload: refused (400, as Triton refuses a load), saying why."""
    verb = request.path_params["verb"]
    if verb not in ("load", "unload"):
        raise Refused(404, f"no such path: POST {request.url.path}; the repository takes load and unload",
                      code="not_found")
    raise Refused(400, f"ModelGrid does not {verb} models on request: its scheduler decides what is loaded where, "
                  "waking or loading a model when requests come for it. Create, scale or delete a deployment "
                  "instead (/api/v1/deployments)", code="unsupported")


async def _ready_only(request: Request) -> bool:
    """The index request's "ready": false for an empty body (as tritonclient sends it); a 400 saying what is wrong
    otherwise."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_INDEX_BODY:
            raise Refused(413, f"an index request body is at most {MAX_INDEX_BODY} bytes", code="request_too_large")
    if not raw.strip():
        return False
    try:
        body = json.loads(raw)  # at most MAX_INDEX_BODY bytes: parsed at once
    except (ValueError, RecursionError) as e:
        raise Refused(400, f"the request body is not valid JSON ({e})", code="invalid_request") from None
    if not isinstance(body, dict):
        raise Refused(400, 'the index request body must be a JSON object, such as {"ready": true}, or empty',
                      code="invalid_request")
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise Refused(400, f"'ready' must be true or false, got {str(ready)[:40]!r}", code="invalid_request")
    return ready
