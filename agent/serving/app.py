"""The agent's Open Inference Protocol (KServe v2 REST) server over its ready workers.

Models are addressed by deployment name. Every error is `{"error": "..."}` with a status that says
whose move it is: 400 the request, 404 the name, 503 the replica (loading, failed, or asleep and not
woken in time), 507 the replica's memory (the request needs more than its share), 500/504 the worker.
A request for a model whose replicas here all sleep wakes one and is answered once it is ready.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

import agent
from agent.serving.tensors import BadRequest, encode_outputs, parse_infer_request
from agent.workers.spec import SIGNATURES, WorkerSpec
from agent.workers.supervisor import (
    InferenceInputError,
    InferenceOutOfMemory,
    InferenceTimeout,
    WakeFailed,
    WorkerUnavailable,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # aiohttp's 1 MiB default is too small for a batch of long sequences


class Replica(Protocol):
    """What the server needs of a worker (WorkerHandle has it; tests may pass a fake)."""

    spec: WorkerSpec
    state: str
    reason: str
    info: dict[str, Any]
    queued: int

    async def infer(self, inputs: dict[str, Any]) -> dict[str, Any]: ...


class ReplicaSource(Protocol):
    """Where the replicas come from (the Agent). It may also have `async wake(name) -> Replica`, which
    returns a ready replica of that deployment, waking one if need be, or raises WorkerUnavailable."""

    def handles(self) -> list[Any]: ...


WAKEABLE = ("sleeping", "preloaded")
# States that are where the console wants them, not on their way to serving.
RESTING = ("sleeping", "preloaded", "stopped")


SOURCE = web.AppKey("source", ReplicaSource)


def make_app(source: ReplicaSource) -> web.Application:
    """The v2 REST application over `source.handles()` (the Agent, a Supervisor, or a fake)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors])
    app[SOURCE] = source
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/models/{name}", model_metadata)
    app.router.add_get("/v2/models/{name}/ready", model_ready)
    app.router.add_post("/v2/models/{name}/infer", infer)
    return app


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    """Ready when every replica meant to serve is ready (vacuously so with none); sleeping, preloaded and
    evicted replicas are where the console wants them."""
    waiting = [h for h in request.app[SOURCE].handles() if h.state not in ("ready", *RESTING)]
    if waiting:
        return error(503, "not ready: " + "; ".join(_describe(h) for h in waiting))
    return web.json_response({"ready": True})


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": "modelgrid-agent", "version": agent.__version__, "extensions": []})


async def model_metadata(request: web.Request) -> web.Response:
    replicas, name = _replicas(request)
    if not replicas:
        return _unknown(request, name)
    # Any replica describes the model; a ready one also knows its output width.
    best = next((h for h in replicas if h.state == "ready"), replicas[0])
    signature = SIGNATURES.get(best.spec.task)
    if signature is None:
        return error(503, _not_ready_text(name, replicas))
    width = best.info.get("output_dim", -1)
    output_shape = [-1, -1, width] if signature.output_rank == 3 else [-1, width]
    return web.json_response(
        {
            "name": name,
            "versions": [],
            "platform": "pytorch",
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": [-1, -1]} for t in signature.inputs],
            "outputs": [{"name": signature.output.name, "datatype": signature.output.datatype, "shape": output_shape}],
        }
    )


async def model_ready(request: web.Request) -> web.Response:
    replicas, name = _replicas(request)
    if not replicas:
        return _unknown(request, name)
    if not any(h.state == "ready" for h in replicas):
        return error(503, _not_ready_text(name, replicas))
    return web.json_response({"name": name, "ready": True})


async def infer(request: web.Request) -> web.Response:
    replicas, name = _replicas(request)
    if not replicas:
        return _unknown(request, name)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return error(400, f"the request body is not valid JSON ({e})")
    signature = SIGNATURES[replicas[0].spec.task]
    try:
        parsed = parse_infer_request(body, signature)
    except BadRequest as e:
        return error(400, str(e))
    candidates = [h for h in replicas if h.state == "ready"]
    wake = getattr(request.app[SOURCE], "wake", None)
    try:
        if candidates:
            replica = min(candidates, key=lambda h: h.queued)  # least busy first
        elif wake is not None and any(h.state in WAKEABLE for h in replicas):
            replica = await wake(name)  # bounded by the agent's --wake-timeout
        else:
            return error(503, _not_ready_text(name, replicas))
        outputs = await replica.infer(parsed.inputs)
    except InferenceInputError as e:
        return error(400, str(e))
    except InferenceOutOfMemory as e:
        return error(507, f"model {name!r} cannot take this request: {e}")
    except WakeFailed as e:
        return error(503, str(e))
    except WorkerUnavailable as e:
        return error(503, f"model {name!r} is not ready: {e}")
    except InferenceTimeout as e:
        return error(504, str(e))
    except Exception as e:  # InferenceError and anything unexpected: the worker's fault, not the client's
        log.exception("inference on %s failed", name)
        return error(500, f"inference failed: {e}")
    return web.json_response(
        {
            "model_name": name,
            "id": parsed.id,
            "outputs": encode_outputs(outputs, signature, parsed.outputs),
        }
    )


def _replicas(request: web.Request) -> tuple[list[Any], str]:
    name = request.match_info["name"]
    return [h for h in request.app[SOURCE].handles() if h.spec.deployment == name], name


def _unknown(request: web.Request, name: str) -> web.Response:
    known = sorted({h.spec.deployment for h in request.app[SOURCE].handles()})
    served = f" (it serves: {', '.join(known)})" if known else " (it serves no models right now)"
    return error(404, f"model {name!r} is not served by this agent{served}")


def _describe(handle: Any) -> str:
    text = f"replica {handle.spec.replica_id} of {handle.spec.deployment!r} is {handle.state}"
    return f"{text}: {handle.reason}" if handle.reason else text


def _not_ready_text(name: str, replicas: list[Any]) -> str:
    return f"model {name!r} is not ready: " + "; ".join(_describe(h) for h in replicas)


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    # aiohttp answers unknown routes and oversized bodies in plain text; v2 clients expect {"error"}.
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error(e.status, f"{e.reason}: {request.method} {request.path}")
