"""Sending a request on to a replica: the body (size-limited), the model it names, concurrency limits, a
ready replica (waiting in the deployment's queue while the scheduler wakes or places one), the agent with
its host's secret, and the answer (streamed through when the agent streams). A connection that fails before
the first byte is retried once on another replica, and so is a request still waiting for its answer when its
replica's host is lost (failover.py); a client that goes away cancels the upstream request. The wait for an
answer and the gaps in a stream are bounded: a stream that breaks off ends with an error event."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from agent.engines import ENGINES
from agent.protocol import UNSERVED_HEADER
from console.gateway import reservation
from console.gateway.auth import Caller, bearer, unauthorized
from console.gateway.core import Gateway, Refused
from console.gateway.errors import Family
from console.gateway.failover import HostLost, host_state
from console.gateway.fleet import DeploymentView, FleetView, ReplicaView
from console.gateway.flow import BANDS, CRITICALITY_HEADER, band_of
from console.gateway.routes import FALLBACK_STATUSES, GONE, ROUTE_HEADER, BranchView, RouteView, retry_branch
from console.gateway.slots import WAIT, Ask, Picked
from console.gateway.streaming import CLIENT_CLOSED, stream
from console.gateway.triton import check_version
from console.gateway.upstream import (
    INFERENCE_HEADER_LENGTH,
    PASSED_HEADERS,
    Broken,
    Unreachable,
    Upstream,
    pieces,
)
from console.gateway.usage import STREAMED_PATHS, Meter, ask_for_usage

ROUTING_HEADER = "x-modelgrid-routing"  # why the replica was chosen (x-modelgrid-route names a route's branch)
PREDICTED_HEADER = "x-modelgrid-predicted-ttft-ms"  # when its first byte was expected (predict.py)
PARSE_INLINE_BYTES = 256 * 1024  # bodies above this are parsed in a worker thread, off the event loop
MAX_DEPTH = 32  # as the agents take (agent.serving.body): a v2 tensor nested by shape is 4 deep
# JSON values a body may hold for the gateway to parse it (for its model or adapter name): as the agents take at most
# (embeddings: 2,048 inputs of 512 token ids). Parsing holds the interpreter lock however it is threaded, ~1 us a
# value: counted first, at C speed, so a body of millions of values never stalls the gateway's loop.
MAX_VALUES = 1 << 20
TOO_DEEP = f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep, the most this gateway takes"


def resolve(fleet: FleetView, name: str) -> tuple[DeploymentView, str | None]:
    """A model name as the client wrote it, or a 404 that says how to find the right one."""
    found = fleet.resolve(name)
    if found is None:
        raise Refused(404, f"model {name!r} does not exist; GET /v1/models lists the models you can use",
                      code="model_not_found")
    return found


def known(caller: Caller, dep: DeploymentView, name: str = "") -> None:
    """Refuse a token of another team as if `name` (the model it asked for; else the deployment's) did not exist
    (404, as resolve() answers: existence is not leaked across teams; console/accounts/teams.py)."""
    if not caller.in_team(dep.team):
        raise Refused(404, f"model {name or dep.name!r} does not exist; GET /v1/models lists the models you can use",
                      code="model_not_found")


def visible_route(caller: Caller, route: RouteView, fleet: FleetView) -> bool:
    """Whether `caller` may see and call `route`: it is of one of the caller's teams, and the caller may call one of
    its branches' deployments (a token limited to some deployments); else its name answers as unknown."""
    if not caller.in_team(route.team):
        return False
    if not route.branches:  # all its deployments deleted: its team still sees it, to be told why it cannot serve
        return not caller.deployments
    return any(b.deployment in fleet.deployments and caller.in_team(fleet.deployments[b.deployment].team)
               and caller.may_call(b.deployment) for b in route.branches)


def permitted(caller: Caller, dep: DeploymentView, name: str = "") -> None:
    """Refuse a token of another team as if the model did not exist (404), and one limited to other deployments
    with 403."""
    known(caller, dep, name)
    if not caller.may_call(dep.name):
        raise Refused(403, caller.forbidden(dep.name), code="permission_denied")


async def proxy(gw: Gateway, request: Request, family: Family, fallback: bool = False) -> Response:
    """Answer one data-plane request through a replica (`fallback`: a route's second try of one request)."""
    arrived = time.monotonic()
    await gw.ensure_started()
    caller = await gw.authenticate(bearer(request.headers.get("authorization")))
    if refused := unauthorized(caller, datetime.now(UTC)):
        return family.error(401, refused, "invalid_api_key")
    deployment, adapter, status, queue_s, team, served, hold = "", None, 500, 0.0, 0, True, None
    meter, need, seconds, streaming, finished = Meter(), reservation.NOTHING, None, False, False

    def waited(seconds: float) -> None:
        nonlocal queue_s
        queue_s += seconds

    def finish(final: int | None = None) -> None:
        """Record and account the request once it is over (a stream's when it ends, with how it ended), once."""
        nonlocal finished, status
        if finished:
            return
        finished, status = True, final or status
        if hold is not None:
            gw.release(caller, deployment)
        gw.record(deployment, adapter, status, seconds, queue_s, served)
        gw.account(deployment, team, caller, status, queue_s, *meter.charged(need, status == CLIENT_CLOSED), hold)

    try:
        body = await _read_body(request, gw.settings.max_body_bytes)
        name, adapter, parsed = await _model_name(request, body, family)
        if (route := gw.fleet.routes.get(name)) is not None and visible_route(caller, route, gw.fleet):
            return await _routed(gw, request, family, body, route)
        dep, adapter = _target(gw, name, adapter, caller)
        check_version(request)
        permitted(caller, dep, name)  # before `deployment` is set: a 403 is the token's doing, not the deployment's
        deployment, team = dep.name, dep.team
        need = reservation.need(request.scope["path"], parsed, len(body), dep.context)  # the client's own body
        ask = _ask(request, parsed, dep, caller, need)
        if parsed is not None and parsed.get("stream") is True and request.scope["path"] in STREAMED_PATHS:
            body = await _with_usage(body, parsed, meter)
        if not family.openai and dep.engine in ENGINES and not ENGINES[dep.engine].in_worker:
            raise Refused(400, f"model {dep.name!r} runs on the {dep.engine} engine, which serves /v1 (completions, "
                          "chat, responses) and not v2 tensors", code="unsupported_by_engine")
        hold = gw.admit(caller, dep, again=fallback, need=need)  # in flight until finish() (a stream's: its end)
        dep, queue_s = await gw.ready_view(dep.name)
        blocks = gw.prompt_blocks(request.scope["path"], parsed, dep, adapter)  # the client's own prompt
        response = await _send(gw, gw.upstream, request, body, dep, adapter, queue_s, arrived, finish,
                               meter if family.openai else None, blocks, ask, waited)
        status, streaming = response.status_code, isinstance(response, StreamingResponse)
        return response
    except Refused as e:
        status, served = e.status, not e.callers
        refusal = family.error(e.status, str(e), e.code, e.retry_after)
        refusal.callers = e.callers  # for a route: its fallback would meet the same limit
        # For a route's fallback: whether the caller's limits counted this try (a refusal before, or at the
        # deployment's own concurrency limit, counted nothing: the fallback is then counted and judged afresh).
        refusal.counted = hold is not None
        return refusal
    except ClientDisconnect:
        status = CLIENT_CLOSED
        return Response(status_code=CLIENT_CLOSED)
    except asyncio.CancelledError:
        status = CLIENT_CLOSED
        raise
    finally:
        seconds = time.monotonic() - arrived  # a stream's: until its headers (its events are timed apart)
        if deployment and not streaming:
            finish()


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"the request body is {int(declared)} bytes; this gateway takes at most {limit} "
                      "(MODELGRID_GATEWAY_MAX_BODY_BYTES)", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"the request body is over {limit} bytes, the most this gateway takes "
                          "(MODELGRID_GATEWAY_MAX_BODY_BYTES)", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _model_name(request: Request, body: bytes, family: Family) -> tuple[str, str | None, dict | None]:
    """The model the request names, (v2) the adapter its parameters name, and (OpenAI) the parsed body."""
    if not family.openai:
        name = request.path_params["name"]
        header = _json_header(request, body)
        if b'"adapter"' not in header:  # most v2 requests: no need to parse a large tensor body
            return name, None, None
        parsed = await _parse(header)
        params = parsed.get("parameters") if isinstance(parsed, dict) else None
        adapter = params.get("adapter") if isinstance(params, dict) else None
        if adapter is not None and not isinstance(adapter, str):
            raise Refused(400, "parameters.adapter must be an adapter's name (a string)", code="invalid_request")
        return name, adapter, None
    parsed = await _parse(body)
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(model, str) or not model:
        raise Refused(400, "the request body must be a JSON object with 'model' naming a model "
                      "(GET /v1/models lists them)", code="invalid_request")
    return model, None, parsed


async def _with_usage(body: bytes, parsed: dict, meter: Meter) -> bytes:
    """A streamed request's body asking for its usage chunk (the engines count its tokens); the client's own
    when it asked for it already."""
    meter.strip = ask_for_usage(parsed)
    if not meter.strip:
        return body
    encode = lambda: json.dumps(parsed).encode()  # noqa: E731
    return encode() if len(body) <= PARSE_INLINE_BYTES else await asyncio.to_thread(encode)


def _json_header(request: Request, body: bytes) -> bytes:
    """A v2 body's JSON: all of it, or with Triton's binary tensor extension the Inference-Header-Content-Length
    bytes before the raw tensor bytes, which are never parsed."""
    declared = request.headers.get(INFERENCE_HEADER_LENGTH)
    if declared is None:
        return body
    text = declared.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 20):
        raise Refused(400, "the Inference-Header-Content-Length header must be the JSON header's length in bytes, "
                      f"got {declared[:40]!r}", code="invalid_request")
    if int(text) > len(body):
        raise Refused(400, f"the Inference-Header-Content-Length header says the JSON header is {int(text)} bytes, "
                      f"but the body is {len(body)} bytes", code="invalid_request")
    return body[: int(text)]


async def _parse(body: bytes):
    if len(body) > PARSE_INLINE_BYTES:
        return await asyncio.to_thread(_parse_now, body)
    return _parse_now(body)


def _parse_now(body: bytes):
    values = body.count(b",") + 1  # every value but the first follows a comma (see agent.serving.body)
    if values > MAX_VALUES:
        raise Refused(413, f"the request body holds about {values} JSON values; this gateway takes at most "
                      f"{MAX_VALUES}", code="request_too_large")
    try:
        parsed = json.loads(body)
    except RecursionError:  # nested past the interpreter's recursion limit, far past MAX_DEPTH
        raise Refused(400, TOO_DEEP, code="invalid_request") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise Refused(400, f"the request body is not valid JSON ({e})", code="invalid_request") from None
    if _deeper_than(parsed, MAX_DEPTH):
        raise Refused(400, TOO_DEEP, code="invalid_request")
    return parsed


def _deeper_than(value, limit: int) -> bool:
    """Whether `value`'s lists and dicts nest more than `limit` deep; a level at a time, without recursion."""
    level, depth = ([value] if type(value) in (list, dict) else []), 0
    while level and depth <= limit:
        depth += 1
        inner = []
        for item in level:
            inner += [c for c in (item.values() if type(item) is dict else item) if type(c) in (list, dict)]
        level = inner
    return depth > limit


def _ask(request: Request, parsed: dict | None, dep: DeploymentView, caller: Caller, need: reservation.Need) -> Ask:
    """What flow control and the predictor go by: its band (its header, else its deployment's tier), whose it is,
    and its size; 400 for a criticality that is not one of the bands."""
    try:
        band = band_of(request.headers.get(CRITICALITY_HEADER), dep.tier)
    except ValueError as e:
        raise Refused(400, str(e), code="invalid_request") from None
    streamed = isinstance(parsed, dict) and parsed.get("stream") is True
    return Ask(band, caller.token_key, float(max(1, need.tokens)), need.prompt, need.completion * need.choices,
               streamed)


async def _slot(gw: Gateway, request: Request, dep: DeploymentView, adapter: str | None, avoid: set[int],
                blocks: tuple, ask: Ask, waited: float) -> tuple[Picked | None, float]:
    """A replica slot (gw.acquire), and how long the request waited for it, within what is left of the queue wait
    after `waited` seconds; a client that leaves while it waits gives its place up."""
    picked = gw.acquire_now(dep, adapter, avoid, blocks, ask)
    if picked is not WAIT:
        return picked, 0.0
    began = time.monotonic()
    budget = gw.settings.queue_wait_s - waited
    picked = await _until_disconnect(request, gw.acquire(dep, adapter, avoid, blocks, ask, budget))
    return picked, time.monotonic() - began


def _target(gw: Gateway, name: str, adapter: str | None, caller: Caller) -> tuple[DeploymentView, str | None]:
    dep, named_adapter = resolve(gw.fleet, name)
    known(caller, dep, name)  # before anything is said of its adapters
    if named_adapter is not None:
        if adapter not in (None, named_adapter):
            raise Refused(400, f"model {name!r} is an adapter; it cannot take adapter {adapter!r} too",
                          code="invalid_request")
        return dep, named_adapter
    if adapter is not None and adapter not in dep.adapters:
        have = ", ".join(dep.adapters) or "none"
        raise Refused(404, f"model {name!r} has no adapter {adapter!r} (it has: {have})", code="adapter_not_found")
    return dep, adapter


async def _send(gw: Gateway, upstream: Upstream, request: Request, body: bytes, dep: DeploymentView,
                adapter: str | None, queue_s: float, arrived: float, finish: Callable[[int], None],
                meter: Meter | None = None, blocks: tuple = (), ask: Ask | None = None,
                waited: Callable[[float], None] = lambda s: None) -> Response:
    """Send to a replica (`blocks`: the prompt's leading blocks, for prefix-aware routing); a connection that fails
    before any byte comes back, or a request whose replica's host is lost before it answers, is sent once elsewhere.
    A stream calls `finish` with how it ended, once it has; `waited` is told each further wait (for a slot, for a
    ready replica), which the request's queue time counts."""
    query = request.scope.get("query_string", b"")
    path = request.scope["path"] + (f"?{query.decode('latin-1')}" if query else "")
    tried: set[int] = set()
    unserved = None  # a first replica's agent refused it untouched: its answer, should no other replica take it
    lost = None  # a replica's host was lost before it answered: why, should no other replica take it
    ask = ask or Ask()
    for attempt in range(2):
        picked, more = await _slot(gw, request, dep, adapter, tried, blocks, ask, queue_s)
        queue_s += more
        waited(more)
        if picked is None and lost is None and (attempt == 0 or unserved is not None):
            # Every ready replica is suspect, or the one tried does not serve now (asleep, draining): wait in the
            # deployment's queue while the scheduler wakes or places one, as for a model that was not ready.
            try:
                dep, more = await gw.ready_view(dep.name)
            except Refused as e:
                if unserved is None or e.status == GONE:  # deleted meanwhile: a route takes that to a live branch
                    raise
                break  # waited in vain: the agent's own refusal says why
            queue_s += more
            waited(more)
            picked, more = await _slot(gw, request, dep, adapter, tried if unserved is None else frozenset(), blocks,
                                       ask, queue_s)
            queue_s += more
            waited(more)
        if picked is None:
            if unserved is not None:
                break
            if lost is not None:
                raise Refused(504, f"{lost}, and no other replica of model {dep.name!r} is ready", retry_after=2,
                              code="upstream_timeout")
            raise Refused(503, f"no ready replica of model {dep.name!r} could be reached", retry_after=2,
                          code="model_not_ready")
        replica = picked.replica
        tried.add(replica.id)
        headers = {"x-modelgrid-replica": replica.label, ROUTING_HEADER: picked.reason,
                   "x-modelgrid-queue-ms": f"{1000 * queue_s:.1f}", PREDICTED_HEADER: f"{1000 * picked.predicted:.0f}",
                   CRITICALITY_HEADER: BANDS[ask.band]}
        with gw.in_flight(dep, replica, taken=True, flow=ask.flow) as slot:  # its slot, from _slot, freed at the end
            if queue_s and await request.is_disconnected():  # its client left while it waited: nothing is sent
                raise ClientDisconnect()
            if meter is not None:
                meter.sent = True  # from here its engine may run it: a client that leaves still owes it
            sent = gw.sending(picked)
            try:
                upstream_response, content = await _exchange(gw, upstream, replica, request, path, body)
            except BaseException as e:
                sent.first_byte(None)  # no answer: it leaves the replica's prefill backlog, teaching nothing
                if isinstance(e, Unreachable):
                    gw.suspect(replica)
                    continue
                if isinstance(e, HostLost):
                    lost = e
                    continue
                raise
            sent.ok = upstream_response.status < 400  # an error's time teaches the predictor nothing
            if content is None:
                slot.kept = True  # the stream frees it when it ends
                return stream(gw, dep, adapter, upstream_response, headers, arrived, replica, finish, meter, sent)
            sent.first_byte(time.monotonic())
            if attempt == 0 and upstream_response.status == 503 and UNSERVED_HEADER in upstream_response.headers:
                # None of it serves there now (draining, asleep): nothing ran, so another replica may take it, and the
                # gateway's picture of this one is behind.
                unserved = upstream_response, content
                gw.suspect(replica)
                continue
        if meter is not None:
            meter.read(content)
        return _answer(upstream_response, content, headers)
    if unserved is not None:
        return _answer(*unserved, headers)
    if lost is not None:
        raise Refused(504, str(lost), retry_after=2, code="upstream_timeout")
    raise Refused(502, f"model {dep.name!r}: its replicas could not be reached ({', '.join(map(str, tried))})",
                  retry_after=2, code="upstream_unreachable")


async def _routed(gw: Gateway, request: Request, family: Family, body: bytes, route: RouteView) -> Response:
    """A request to a route: to a branch chosen by weight, as if the client had named it, and on once when that branch
    is gone (to another live branch), refused or overloaded (to the route's fallback); the answer names the branch
    that served (x-modelgrid-route). The second try counts against the caller's limits only if the first did not."""
    branch = route.choose(gw.rng.random())
    if branch is None:
        raise Refused(503, f"route {route.name!r} has no branches left (their deployments were deleted); give it one "
                      f"(PATCH /api/v1/routes/{route.name})", code="model_not_ready")
    response = await proxy(gw, await _retargeted(request, family, body, branch.model), family)
    served, first = branch.target, response.status_code
    target = None
    if first in FALLBACK_STATUSES and not isinstance(response, StreamingResponse) \
            and not getattr(response, "callers", False):
        if first == GONE and (live := _live_branch(gw, route, branch)) is not None:
            target, how = live.model, f"{live.target} (retried: {branch.target} answered {first})"
        elif route.fallback not in (None, branch.deployment):
            target, how = route.fallback, f"{route.fallback} (fallback: {branch.target} answered {first})"
    if target is not None:
        again = getattr(response, "counted", True)
        response = await proxy(gw, await _retargeted(request, family, body, target), family, fallback=again)
        served = how
    response.headers[ROUTE_HEADER] = f"{route.name} -> {served}"
    return response


def _live_branch(gw: Gateway, route: RouteView, gone: BranchView) -> BranchView | None:
    """Another branch of the route as the snapshot has it now (the gone one's deployment may have left it)."""
    fleet = gw.fleet
    now = fleet.routes.get(route.name, route)
    return retry_branch(now, gone, fleet.deployments, fleet.adapters, gw.rng.random())


async def _retargeted(request: Request, family: Family, body: bytes, model: str) -> Request:
    """`request` as if it named `model`: the body's `model` (OpenAI) or the path's model name (v2) replaced; the
    client's disconnect still reaches it."""
    scope = dict(request.scope)
    if family.openai:
        parsed = await _parse(body)
        parsed["model"] = model
        encode = lambda: json.dumps(parsed).encode()  # noqa: E731
        body = encode() if len(body) <= PARSE_INLINE_BYTES else await asyncio.to_thread(encode)
    else:
        prefix = f"/v2/models/{request.path_params['name']}"
        scope["path"] = f"/v2/models/{model}{scope['path'][len(prefix):]}"
        scope["path_params"] = {**request.path_params, "name": model}
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return await request.receive()  # the client's disconnect, when it comes
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def _answer(upstream_response: aiohttp.ClientResponse, content: bytes, headers: dict) -> Response:
    for name in PASSED_HEADERS:
        if name in upstream_response.headers:
            headers[name] = upstream_response.headers[name]
    return Response(content, status_code=upstream_response.status, headers=headers)


async def _exchange(gw: Gateway, upstream: Upstream, replica: ReplicaView, request: Request, path: str,
                    body: bytes) -> tuple[aiohttp.ClientResponse, bytes | None]:
    """The agent's response with its whole body, or (a stream) with the body still to read (None). Server-sent
    events and answers of unknown length (the agent streams large v2 tensors) pass through as they come."""
    response = await _answered(gw, request, replica, upstream.send(
        replica, request.method, path, body, request.headers.get("content-type"),
        request.headers.get(INFERENCE_HEADER_LENGTH)))
    if response.content_type == "text/event-stream" or response.content_length is None:
        return response, None
    try:
        return response, await _until_disconnect(request, _whole(response, gw.settings.stream_idle_s))
    except Broken as e:  # it answered, so it may have run the request: not sent again
        raise Refused(502, f"replica {replica.label} on host {replica.host} {e}", retry_after=2,
                      code="upstream_broken") from e
    finally:
        response.release()


async def _whole(response: aiohttp.ClientResponse, idle_s: float) -> bytes:
    return b"".join([piece async for piece in pieces(response, idle_s)])


async def _answered(gw: Gateway, request: Request, replica: ReplicaView, send):
    """The response `send` gets from `replica` (its headers) within the response timeout, else 504 naming the replica
    and its host's state; HostLost when the replica's host leaves the connected state first (nothing was answered:
    the request may go elsewhere); ClientDisconnect when the client goes away."""
    task, began, limit = asyncio.current_task(), time.monotonic(), gw.settings.response_timeout_s
    with gw.waiting.on(replica) as wait:
        try:
            async with asyncio.timeout(limit) as bound:
                return await _until_disconnect(request, send)
        except TimeoutError:
            if not bound.expired():
                raise
            raise Refused(504, _unanswered(gw, replica, limit), retry_after=2, code="upstream_timeout") from None
        except asyncio.CancelledError:
            if not wait.lost or task.cancelling() > 1:  # not (only) this gateway's doing
                raise
            task.uncancel()
            raise HostLost(_unanswered(gw, replica, time.monotonic() - began)) from None


def _unanswered(gw: Gateway, replica: ReplicaView, waited: float) -> str:
    return (f"replica {replica.label} on host {replica.host} did not answer within {waited:.3g} s "
            f"({host_state(gw.fleet.hosts, replica.host)})")


async def _until_disconnect(request: Request, work):
    """Await `work` in this task, cancelled when the client goes away (the agent then sees its connection
    close). One watcher task per request; the work itself runs inline, which keeps the hot path cheap."""
    current = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        current.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if gone and current.cancelling() <= 1:
            current.uncancel()
            raise ClientDisconnect() from None
        raise
    finally:
        watcher.cancel()
