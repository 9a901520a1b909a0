"""Requests for a vLLM replica pass through to its server: the body as the client wrote it (the model name
made the one vLLM serves it under, when the client used another), and vLLM's answer as it came, status and
errors included, streamed as it streams. So vLLM's own features work through ModelGrid unchanged: tools,
structured outputs, echo and logprobs, n, /v1/responses, /tokenize.

The replica counts the request as its own while it runs (a drain waits for it). A client that goes away closes
the connection to vLLM, which aborts the generation. A vLLM that dies or goes silent mid-stream ends the client's
stream at once, as vLLM ends a stream that fails: an error event, then `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from agent.metrics import Metrics
from agent.serving.body import RAW_BODY
from agent.serving.dispatch import Dispatcher, Failed, NotReady, Route

CONNECT_TIMEOUT_S = 5.0
STREAMED = ("text/event-stream",)
MAX_PENDING = 64 * 1024  # a stream without an event boundary this long is passed on as it comes (not SSE as expected)
SESSION = web.AppKey("relay_session", aiohttp.ClientSession)


def add_relay(app: web.Application, read_timeout: float) -> None:
    """One pooled client for every relayed request; a read that waits past `read_timeout` s ends it."""
    async def session(app: web.Application):
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=read_timeout)
        app[SESSION] = aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                             cookie_jar=aiohttp.DummyCookieJar())
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)


async def relay(request: web.Request, dispatcher: Dispatcher, route: Route, body: dict[str, Any],
                path: str) -> web.StreamResponse:
    """Send the request to the least busy serving replica of `route` (vLLM) and answer with what it says."""
    replica = await dispatcher.pick(route)
    served = route.adapter or route.deployment
    raw = request.get(RAW_BODY)
    if raw is None or body.get("model") != served:
        raw = await asyncio.to_thread(lambda: json.dumps(body | {"model": served}).encode())
    headers = {"Authorization": f"Bearer {replica.info['key']}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{replica.info['port']}{path}"
    replica.picked += 1
    replica.last_used = time.monotonic()
    try:
        try:
            upstream = await request.config_dict[SESSION].post(url, data=raw, headers=headers)
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise NotReady(f"replica {replica.spec.replica_id} of {route.deployment!r}: its vLLM server cannot be "
                           f"reached ({e or type(e).__name__})") from e
        try:
            answer = await _answer(request, upstream, TokenTimes(dispatcher.metrics, route.deployment),
                                   f"replica {replica.spec.replica_id} of {route.deployment!r}")
        except BaseException:
            upstream.close()  # not back to the pool: a client gone mid-stream must drop vLLM's connection
            raise
        upstream.release()  # answered whole: its connection serves the next request (vLLM pays for each new one)
        return answer
    finally:
        replica.picked -= 1


class TokenTimes:
    """A relayed stream's events as the agent's token metrics (time to the first, then between them), so a vLLM
    deployment's figures read as the built-in engine's do. One event is one token or more: vLLM holds back the
    pieces of a character split across tokens."""

    def __init__(self, metrics: Metrics | None, deployment: str) -> None:
        self.metrics, self.deployment = metrics, deployment
        self.started = self.last = time.monotonic()
        self.events = 0

    def chunk(self, data: bytes) -> None:
        events = data.count(b"data:") - data.count(b"data: [DONE]")
        if self.metrics is None or events <= 0:
            return
        now = time.monotonic()
        if not self.events:
            self.metrics.token(self.deployment, now - self.started, first=True)
            self.events, events = 1, events - 1
        if events:  # the events of one read together: one observation of their mean gap (a stream is thousands)
            self.metrics.token(self.deployment, (now - self.last) / events, first=False, count=events)
            self.events += events
        self.last = now


async def _answer(request: web.Request, upstream: aiohttp.ClientResponse, tokens: TokenTimes,
                  replica: str) -> web.StreamResponse:
    content_type = upstream.headers.get("Content-Type", "application/json")
    if upstream.content_type not in STREAMED:
        return web.Response(body=await upstream.read(), status=upstream.status, headers={"Content-Type": content_type})
    response = web.StreamResponse(status=upstream.status, headers={"Content-Type": content_type,
                                                                   "Cache-Control": "no-cache"})
    await response.prepare(request)
    pending = b""  # an event not yet whole: held back, so that an error event never lands inside it
    try:
        async for chunk in upstream.content.iter_any():
            tokens.chunk(chunk)
            whole, pending = _whole_events(pending + chunk)
            if whole:
                await response.write(whole)
    except (asyncio.CancelledError, ConnectionResetError):
        if tokens.metrics is not None:
            tokens.metrics.cancelled(tokens.deployment, "client")
        raise
    except (aiohttp.ClientError, TimeoutError) as e:  # vLLM died (its connection closed) or went silent
        upstream.close()  # never back to the pool with half an answer in it
        why = f"sent nothing for {request.config_dict[SESSION].timeout.sock_read:g} s" \
            if isinstance(e, TimeoutError) else f"broke off the stream ({type(e).__name__})"
        await response.write(_error_event(f"{replica}: its vLLM server {why}; the answer is incomplete"))
        pending = b""
    if pending:
        await response.write(pending)
    await response.write_eof()
    return response


def _whole_events(data: bytes) -> tuple[bytes, bytes]:
    """`data` split after its last event boundary (LF LF, or CRLF CRLF: SSE allows both): what may be sent, and the
    start of an event still to come."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    if not end and len(data) > MAX_PENDING:
        return data, b""
    return data[:end], data[end:]


def _error_event(message: str) -> bytes:
    """The end of a stream that failed, in vLLM's shape (and the built-in engine's): an error event, then [DONE]."""
    error = {"error": {"message": message, "type": "server_error", "param": None, "code": Failed.code}}
    return b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n"
