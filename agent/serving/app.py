"""The agent's Open Inference Protocol (KServe v2 REST) server over its ready workers.

Models are addressed by deployment name (or an adapter's name). Every error is `{"error": "..."}` with a
status that says whose move it is: 400 the request (413 its size: agent.serving.body), 401 the caller (only
the console's gateway, with this host's gateway secret, is served: agent.serving.auth), 404 the name, 429 a
full queue, 503 the replica (starting, loading, preloaded, sleeping, stopped or failed: the reason says
which), 507 the replica's memory (the request needs more than its share), 500/504 the worker. The agent
never wakes or loads a replica for a request: only the console's desired state does. Triton's model
configuration and repository index are agent.serving.triton's. The same app serves /v1 (agent.serving.openai)
and /metrics.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

import agent
from agent.metrics import CONTENT_TYPE, Metrics, replica_snapshot
from agent.protocol import MODEL_VERSION, TRITON_EXTENSIONS
from agent.serving.auth import GatewayAuth, PickerAccess, gateway_only
from agent.serving.batching import BatchSettings
from agent.serving.body import MAX_BODY_BYTES, parse_json, read_body, read_json
from agent.serving.dispatch import (
    DISPATCHER,
    RESTING,
    BadInput,
    Dispatcher,
    Replica,
    ReplicaSource,
    ServingError,
    describe,
    engine_of,
    not_ready_text,
    picked_replica,
)
from agent.serving.engine_metrics import engine_metrics
from agent.serving.openai import add_openai_routes, openai_error, unserved_mark
from agent.serving.picker import add_picker_routes
from agent.serving.relay import SESSION
from agent.serving.tensors import (
    ENCODE_CHUNK_VALUES,
    HEADER_LENGTH,
    MAX_REQUEST_TOKENS,
    InferRequest,
    encode_binary_response,
    encode_outputs,
    encode_response_chunks,
    output_values,
    parse_infer_request,
    split_binary_body,
)
from agent.serving.textpool import TextPool
from agent.serving.tokenization import Tokenizers
from agent.serving.triton import check_version, describing, model_config, output_shape, repository_index
from agent.workers.generation_spec import DEFAULT_GENERATION_TIMEOUT
from agent.workers.spec import SIGNATURES, Signature

log = logging.getLogger(__name__)

BINARY_CONTENT_TYPE = "application/octet-stream"
BINARY_WRITE_BYTES = 1 << 20  # a large binary answer is written in slices this big, each a turn for the loop

# JSON values in a v2 body: three inputs of MAX_REQUEST_TOKENS values each, nested by row, fit; parsing this
# many takes well under 0.1 s however they are written (see agent.serving.body).
MAX_V2_VALUES = 4 * MAX_REQUEST_TOKENS

SOURCE = web.AppKey("source", ReplicaSource)
METRICS = web.AppKey("metrics", Metrics)
GATEWAY = web.AppKey("gateway", GatewayAuth)
POSITIONS = web.AppKey("positions", Tokenizers)  # each model directory's max positions, from config.json


__all__ = ["GatewayAuth", "Replica", "ReplicaSource", "make_app"]


def make_app(
    source: ReplicaSource,
    *,
    batching: BatchSettings | None = None,
    metrics: Metrics | None = None,
    auth: GatewayAuth | None = None,
    generation_timeout: float | None = None,
    text: TextPool | None = None,
    picker: PickerAccess | None = None,
) -> web.Application:
    """The inference application over `source.handles()` (a Supervisor): v2, /v1, /metrics and an endpoint
    picker's /msp/... `generation_timeout`: seconds a generation may run when the request names none (default 300).

    Every route but GET /v2/health/live needs the secret held by `auth` (the Agent sets it from each
    desired state); without one (the default: a GatewayAuth with no secret) they are all refused. `picker` lets
    an operator's endpoint picker in besides (agent.serving.auth.PickerAccess; by default, nothing).
    `metrics` defaults to a private registry, so /metrics answers even when the daemon passes none. `text`
    tokenizes prompts and renders chat templates off the loop (a pool of its own by default).
    """
    auth = auth if auth is not None else GatewayAuth()
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,  # for handlers that read with request.json(); read_json has its own
        middlewares=[gateway_only(auth, _unauthorized, picker), _json_errors]
    )
    app[GATEWAY] = auth
    app[SOURCE] = source
    app[METRICS] = metrics if metrics is not None else Metrics(CollectorRegistry())
    app[POSITIONS] = Tokenizers()
    app[DISPATCHER] = Dispatcher(source, batching or BatchSettings(), app[METRICS])
    app.on_cleanup.append(_close_batchers)
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2", server_metadata)
    # Each model has one version (agent.serving.triton): /versions/1/... answers as the plain path.
    for model in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.router.add_get(model, model_metadata)
        app.router.add_get(f"{model}/ready", model_ready)
        app.router.add_get(f"{model}/config", model_configuration)
        app.router.add_post(f"{model}/infer", infer)
    app.router.add_post("/v2/repository/index", repository_index)
    app.router.add_get("/metrics", prometheus_metrics)
    add_picker_routes(app)  # /msp/...: the Model Server Protocol's metrics, for an endpoint picker
    # OpenAI-style /v1/models, /v1/embeddings and /v1/completions, with their own error shape.
    add_openai_routes(app, generation_timeout or DEFAULT_GENERATION_TIMEOUT, text)
    return app


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _unauthorized(request: web.Request, message: str, code: str) -> web.Response:
    # The 401 in the shape of the route family asked: OpenAI's under /v1, {"error"} elsewhere.
    if request.path == "/v1" or request.path.startswith("/v1/"):
        response = openai_error(401, message, code)
    else:
        response = error(401, message)
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    """Ready when every replica meant to serve is ready (vacuously so with none); sleeping, preloaded and
    evicted replicas are where the console wants them."""
    waiting = [h for h in request.app[SOURCE].handles() if h.state not in ("ready", *RESTING)]
    if waiting:
        return error(503, "not ready: " + "; ".join(describe(h) for h in waiting))
    return web.json_response({"ready": True})


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": "modelgrid-agent", "version": agent.__version__,
                              "extensions": list(TRITON_EXTENSIONS)})


async def model_metadata(request: web.Request) -> web.Response:
    replicas, name = _replicas(request)
    _v2_engine(name, replicas)
    best = describing(replicas)
    signature = SIGNATURES.get(best.spec.task)
    if signature is None:
        return error(503, not_ready_text(name, replicas))
    return web.json_response(
        {
            "name": name,
            "versions": [MODEL_VERSION],
            "platform": "pytorch",
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": [-1, -1]} for t in signature.inputs],
            "outputs": [{"name": signature.output.name, "datatype": signature.output.datatype,
                         "shape": output_shape(signature, best.info.get("output_dim", -1))}],
        }
    )


async def model_configuration(request: web.Request) -> web.Response:
    """Triton's model configuration (agent.serving.triton.model_config), from the replica that describes it."""
    replicas, name = _replicas(request)
    _v2_engine(name, replicas)
    best = describing(replicas)
    if best.spec.task not in SIGNATURES:
        return error(503, not_ready_text(name, replicas))
    batching = request.app[DISPATCHER].settings_for(best)
    return web.json_response(model_config(name, best.spec.task, best.info.get("output_dim", -1),
                                          _max_positions(request, replicas), batching))


async def model_ready(request: web.Request) -> web.Response:
    replicas, name = _replicas(request)
    if not any(h.state == "ready" for h in replicas):
        return error(503, not_ready_text(name, replicas))
    return web.json_response({"name": name, "ready": True})


async def infer(request: web.Request) -> web.Response:
    dispatcher = request.app[DISPATCHER]
    replica_id = picked_replica(request)
    route = dispatcher.route(request.match_info["name"], replica_id=replica_id)
    check_version(request, route.name)
    with dispatcher.observe(route) as seen:
        _v2_engine(route.name, route.replicas)
        dispatcher.check(route)  # no replica ready: say so before reading the body
        body, binary = await _infer_body(request)
        signature = SIGNATURES[route.task]
        parsed = parse_infer_request(body, signature, binary=binary,
                                     max_positions=_max_positions(request, route.replicas))
        if parsed.adapter is not None:
            route = dispatcher.route(route.name, parsed.adapter, replica_id)
            seen.adapter = route.adapter
        result = await dispatcher.infer(route, parsed.inputs)
        seen.record(result)
    head = {"model_name": route.name, "id": parsed.id}
    if parsed.binary_outputs:
        return await _binary_answer(request, head, result.outputs, signature, parsed)
    if output_values(result.outputs, signature, parsed.outputs) <= ENCODE_CHUNK_VALUES:
        return web.json_response(head | {"outputs": encode_outputs(result.outputs, signature, parsed.outputs)})
    return await _stream_json(request, encode_response_chunks(head, result.outputs, signature, parsed.outputs))


async def _infer_body(request: web.Request) -> tuple[Any, memoryview | None]:
    """An infer request's JSON and, with Triton's binary tensor extension (an Inference-Header-Content-Length
    header), the raw tensor bytes after it: only the JSON header is parsed, and counted against MAX_V2_VALUES."""
    header_length = request.headers.get(HEADER_LENGTH)
    if header_length is None:
        return await read_json(request, max_values=MAX_V2_VALUES), None
    header, binary = split_binary_body(await read_body(request), header_length)
    return await asyncio.to_thread(parse_json, header, max_values=MAX_V2_VALUES), binary


async def _binary_answer(request: web.Request, head: dict[str, Any], outputs: dict[str, Any], signature: Signature,
                         parsed: InferRequest) -> web.StreamResponse:
    """The binary extension's answer: the JSON header (its length in Inference-Header-Content-Length), then each
    binary output's bytes. A large one is encoded in a thread and written in slices of the worker's array."""
    encode = functools.partial(encode_binary_response, head, outputs, signature, parsed.outputs,
                               parsed.binary_outputs)
    small = output_values(outputs, signature, parsed.outputs) <= ENCODE_CHUNK_VALUES
    header, pieces = encode() if small else await asyncio.to_thread(encode)
    headers = {HEADER_LENGTH: str(len(header))}
    if small:
        return web.Response(body=b"".join([header, *pieces]), headers=headers, content_type=BINARY_CONTENT_TYPE)
    response = web.StreamResponse(headers=headers)  # no Content-Length: the gateway passes it through unbuffered
    response.content_type = BINARY_CONTENT_TYPE
    await response.prepare(request)
    await response.write(header)
    for piece in pieces:
        for start in range(0, len(piece), BINARY_WRITE_BYTES):
            await response.write(piece[start : start + BINARY_WRITE_BYTES])
    await response.write_eof()
    return response


async def _stream_json(request: web.Request, pieces: Iterator[bytes]) -> web.StreamResponse:
    """A large JSON answer written piece by piece as a worker thread encodes it: encoded whole, the logits of
    [64, 256] tokens held the event loop (health checks, heartbeats) for 16 s."""
    response = web.StreamResponse()
    response.content_type, response.charset = "application/json", "utf-8"
    await response.prepare(request)
    while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
        await response.write(piece)
    await response.write_eof()
    return response


def _v2_engine(name: str, replicas: tuple[Any, ...]) -> None:
    """v2 tensors are the built-in engine's: a model on an engine in processes of its own is served through /v1
    only."""
    for engine in dict.fromkeys(engine_of(h) for h in replicas):
        if not engine.in_worker:
            raise BadInput(f"model {name!r} runs on the {engine.name} engine, which serves /v1 (completions, chat, "
                           "responses) and not v2 tensors", code="unsupported_by_engine")


def _max_positions(request: web.Request, replicas: tuple[Any, ...]) -> int | None:
    """The longest sequence the model takes: as its workers reported it, else from its config.json."""
    reported = [h.info.get("max_positions") for h in replicas]
    known = [p for p in reported if isinstance(p, int) and not isinstance(p, bool) and p > 0]
    if known:
        return min(known)
    return request.app[POSITIONS].max_positions(replicas[0].spec.model_path)


async def prometheus_metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    handles = request.app[SOURCE].handles()
    metrics.set_replicas(replica_snapshot(h) for h in handles)
    relayed = await engine_metrics(request.app[SESSION], handles)  # vLLM's own, labelled with their replicas
    return web.Response(body=metrics.render() + relayed, headers={"Content-Type": CONTENT_TYPE})


def _replicas(request: web.Request) -> tuple[tuple[Any, ...], str]:
    route = request.app[DISPATCHER].route(request.match_info["name"], replica_id=picked_replica(request))
    check_version(request, route.name)
    return route.replicas, route.name


async def _close_batchers(app: web.Application) -> None:
    app[DISPATCHER].close()


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    # aiohttp answers unknown routes, oversized bodies and its own failures in plain text; v2 clients expect
    # {"error"}. (/v1 has its own middleware, agent.serving.openai.)
    try:
        return await handler(request)
    except ServingError as e:
        return unserved_mark(error(e.status, str(e)), e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        response = error(e.status, f"{e.reason}: {request.method} {request.path}")
        if e.status == 405 and "Allow" in e.headers:
            response.headers["Allow"] = e.headers["Allow"]
        return response
    except ConnectionResetError:  # the client went away: nobody to answer
        raise
    except Exception as e:  # a bug of ours: still an answer in the client's shape, the traceback in the log
        log.exception("%s %s failed", request.method, request.path)
        return error(500, f"internal error: {type(e).__name__}: {e}")
