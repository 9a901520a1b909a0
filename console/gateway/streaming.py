"""A replica's answer passed through as it comes: server-sent events (or a long answer of unknown length), never
buffered whole, its usage read on the way. However it ends (whole, broken off, its client gone, or never read at
all) it ends once: its replica's count and its connection to the agent are released, and the request is recorded
and accounted with how it ended."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable

import aiohttp
from starlette.responses import StreamingResponse

from console.gateway.core import Gateway
from console.gateway.fleet import DeploymentView, ReplicaView
from console.gateway.slots import Sent
from console.gateway.upstream import PASSED_HEADERS, Broken, error_event, pieces
from console.gateway.usage import Meter

CLIENT_CLOSED = 499  # the client went away before its answer (nginx's convention)
BROKEN = 502  # a stream that broke off after it began, as metrics and usage count it
TAIL_BYTES = 8192  # an OpenAI answer of unknown length is read for its usage in its last this many bytes


def stream(gw: Gateway, dep: DeploymentView, adapter: str | None, upstream_response: aiohttp.ClientResponse,
            headers: dict, arrived: float, replica: ReplicaView, finish: Callable[[int], None],
            meter: Meter | None = None, sent: Sent | None = None) -> StreamingResponse:
    """Server-sent events (or a long answer) passed through as the agent produces them, never buffered whole. An
    OpenAI answer's usage is read on the way (`meter`). When it ends (whole, broken off, its client gone, or never
    read at all) its replica's count and its connection are released and `finish` is told how it ended: its status,
    502 where it broke off or its agent ended it with an error event, 499 where its client went away. `sent` is told
    when its first piece came (the predictor learns from it), or that none did."""
    flow = sent.picked.flow if sent is not None else None  # its slot, handed on by gw.in_flight(), is freed at its end
    events_stream = upstream_response.content_type == "text/event-stream"
    ended = False
    whole: int | None = None  # how the answer ended, once its end went out: a client gone after that read it all
    if meter is not None:
        meter.streamed = events_stream
    for name in PASSED_HEADERS:
        if name in upstream_response.headers:
            headers[name] = upstream_response.headers[name]

    def end(status: int) -> None:
        nonlocal ended
        if ended:
            return
        ended = True
        if status == CLIENT_CLOSED and whole is not None:
            status = whole
        upstream_response.release()
        if sent is not None:
            sent.first_byte(None)  # (nothing, when its first piece came already)
        gw.free(dep.name, replica, flow)
        finish(status)

    async def events() -> AsyncIterator[bytes]:
        nonlocal whole
        first = None
        count = 0
        tail = b""  # an answer of unknown length: its end, where its usage is
        status = CLIENT_CLOSED  # until it ends otherwise
        try:
            async for chunk in pieces(upstream_response, gw.settings.stream_idle_s):
                if sent is not None and sent.open:
                    sent.first_byte(time.monotonic())
                if not events_stream:
                    if meter is not None:
                        tail = (tail + chunk)[-TAIL_BYTES:]
                    yield chunk
                    continue
                if first is None:
                    first = time.monotonic()
                    gw.metrics.ttft.labels(dep.name, adapter or "").observe(first - arrived)
                if meter is not None and not (chunk := meter.events(chunk)):
                    continue
                count += chunk.count(b"data:")
                if b"data: [DONE]" in chunk:
                    whole = BROKEN if meter is not None and meter.failed else upstream_response.status
                yield chunk
            rest = meter.events(b"", last=True) if meter is not None and events_stream else b""
            status = whole = BROKEN if meter is not None and meter.failed else upstream_response.status
            if rest:
                yield rest
        except Broken as e:
            status = BROKEN
            if not events_stream:
                raise  # the connection is dropped: its client sees an answer cut short
            # An event cut in half stays in the meter, not sent: the error starts an event of its own.
            yield error_event(f"replica {replica.label} on host {replica.host} {e}; the answer is incomplete",
                              "upstream_broken")
        finally:
            if meter is not None:
                meter.read(tail)
                if events_stream:
                    meter.cut(count)
            if first is not None and count > 1:
                elapsed = time.monotonic() - first
                if elapsed > 0:
                    gw.metrics.tokens_per_second.labels(dep.name, adapter or "").observe((count - 1) / elapsed)
            end(status)

    body = events()
    # A stream the server never began (its client gone at once) ends too, on its loop (a collection of garbage may
    # run in any thread).
    weakref.finalize(body, _on_loop, asyncio.get_running_loop(), end, CLIENT_CLOSED)
    return StreamingResponse(body, status_code=upstream_response.status, headers=headers,
                             media_type=upstream_response.headers.get("Content-Type", "text/event-stream"))


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[int], None], arg: int) -> None:
    """`fn(arg)` now if this thread runs `loop`, else soon on `loop` (unless it is closed)."""
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:
        here = False
    if here:
        fn(arg)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(fn, arg)
