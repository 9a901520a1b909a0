"""A request's JSON body, read so that no single request can hold the event loop or the process's memory.

`json.loads` is one C call that holds the GIL from start to end, so parsing in a worker thread keeps the
loop free only while the parse is short. Its time grows with the number of JSON values (from ~100 ns for
an integer to ~1 us for a distinct object key, measured here), so a body is refused for its size (413) and
its count of values (413) before it is parsed, and for its nesting depth (400), each refusal naming its limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from agent.serving.dispatch import BadInput, ServingError

MIB = 1024 * 1024
MAX_BODY_BYTES = 16 * MIB  # as the console's gateway takes by default (MODELGRID_GATEWAY_MAX_BODY_BYTES)
MAX_DEPTH = 32  # a v2 tensor nested by shape is 4 deep; nothing an endpoint takes comes near 32
# Parsing 2**18 values took here ~30 ms of small integers, ~60 ms of empty lists, ~140 ms of floats like 1e-300
# and ~250 ms of distinct object keys (the worst found). Callers that know their shape pass a tighter limit.
MAX_VALUES = 1 << 18
_CONTAINERS = (list, dict)  # what json.loads makes of arrays and objects


RAW_BODY = web.RequestKey("raw_body", bytes)
BODY_TIMEOUT_S = 60.0  # a body that trickles in holds a connection and a handler: it must arrive within this


class TooLarge(ServingError):
    status, code = 413, "request_too_large"


class SlowBody(ServingError):
    status, code = 408, "request_timeout"


async def read_json(
    request: web.Request, *, max_bytes: int = MAX_BODY_BYTES, max_depth: int = MAX_DEPTH,
    max_values: int = MAX_VALUES,
) -> Any:
    """The request's body parsed as JSON in a worker thread; TooLarge (413) or BadInput (400) naming the limit
    a body breaks. Reads with these limits, not aiohttp's client_max_size."""
    raw = await read_body(request, max_bytes=max_bytes)
    request[RAW_BODY] = raw  # as it came, for a relay to pass on unchanged (agent.serving.relay)
    return await asyncio.to_thread(parse_json, raw, max_depth=max_depth, max_values=max_values)


async def read_body(request: web.Request, *, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The request's body as bytes, unparsed; TooLarge (413) past `max_bytes`, SlowBody (408) when it trickles."""
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise TooLarge(f"the request body is {declared} bytes; this server takes at most {_size(max_bytes)}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > max_bytes:
                    raise TooLarge(f"the request body is over {_size(max_bytes)}, the most this server takes")
                chunks.append(chunk)
    except TimeoutError:
        raise SlowBody(f"the request body did not arrive within {BODY_TIMEOUT_S:g} s ({size} bytes came)") from None
    return b"".join(chunks)


def parse_json(raw: bytes, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> Any:
    """`raw` parsed as JSON when it is small enough to parse quickly and nests no deeper than `max_depth`;
    TooLarge or BadInput naming the limit otherwise (blocking: call it in a thread)."""
    # Every value but the first follows a comma or is a container opened inside another, and the parser
    # stops nesting at the interpreter's recursion limit (~1000): commas bound the values, counted at C speed.
    values = raw.count(b",") + 1
    if values > max_values:
        raise TooLarge(f"the request body holds about {values} JSON values; this server takes at most {max_values}")
    try:
        parsed = json.loads(raw)
    except RecursionError:  # nested past the interpreter's recursion limit: refused within a millisecond
        raise BadInput(_too_deep(max_depth)) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise BadInput(f"the request body is not valid JSON ({e})") from None
    if nesting_depth(parsed, max_depth) > max_depth:
        raise BadInput(_too_deep(max_depth))
    return parsed


def nesting_depth(value: Any, enough: int = 0) -> int:
    """How deep `value`'s lists and dicts nest (a scalar: 0); stops once past `enough` when it is given."""
    deepest = 0
    level = [value] if type(value) in _CONTAINERS else []
    while level and not (enough and deepest > enough):  # a level at a time: no recursion, one pass per level
        deepest += 1
        inner = []
        for item in level:
            inner += [c for c in (item.values() if type(item) is dict else item) if type(c) in _CONTAINERS]
        level = inner
    return deepest


def _too_deep(limit: int) -> str:
    return f"the request body nests arrays and objects more than {limit} levels deep, the most this server takes"


def _size(limit: int) -> str:
    return f"{limit} bytes ({limit / MIB:g} MiB)" if limit >= MIB else f"{limit} bytes"
