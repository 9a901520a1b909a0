"""Reading a JSON body within limits (agent.serving.body): size, count of values, nesting depth."""

import asyncio
import json
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agent.serving.body import MAX_DEPTH, TooLarge, nesting_depth, parse_json, read_json
from agent.serving.dispatch import BadInput, ServingError


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def test_it_parses_a_body_within_its_limits():
    assert parse_json(b'{"inputs": [{"data": [[1, 2], [3, 4]]}]}') == {"inputs": [{"data": [[1, 2], [3, 4]]}]}
    assert parse_json(deep(MAX_DEPTH)) is not None
    assert parse_json(json.dumps(["[[[[" * 100, "\\[", "]"]).encode())  # brackets inside strings do not nest


@pytest.mark.parametrize("body", [deep(MAX_DEPTH + 1), deep(100_000), b"[" * 1_000_000, b'{"a":' * 100_000 + b"1"])
def test_a_body_nested_past_the_limit_is_a_400_naming_it_at_once(body):
    started = time.monotonic()
    with pytest.raises(BadInput, match=f"nests arrays and objects more than {MAX_DEPTH} levels deep"):
        parse_json(body)
    assert time.monotonic() - started < 1


def test_too_many_values_is_a_413_naming_the_limit_before_parsing():
    with pytest.raises(TooLarge, match="holds about 1001 JSON values; this server takes at most 1000"):
        parse_json(b"[" + b"1," * 1000 + b"1]", max_values=1000)
    assert parse_json(b"[" + b"1," * 999 + b"1]", max_values=1000) == [1] * 1000


@pytest.mark.parametrize("body", [b"{not json", b"", b"\xff\xfe[", b"[" + b"9" * 5000 + b"]"])
def test_a_body_that_is_not_json_is_a_400(body):
    with pytest.raises(BadInput, match="not valid JSON"):
        parse_json(body)


def test_nesting_depth_counts_lists_and_objects():
    assert nesting_depth(5) == 0 and nesting_depth([]) == 1
    assert nesting_depth({"a": [1, {"b": []}], "c": 2}) == 4
    assert nesting_depth(json.loads(deep(50)), 10) == 11  # stops once past what it was asked about


@pytest.fixture
async def post():
    """POST a body to a handler that answers what read_json gives, or the ServingError's status."""

    async def handler(request: web.Request) -> web.Response:
        try:
            return web.json_response({"body": await read_json(request, max_bytes=1 << 20)})
        except ServingError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    app = web.Application()
    app.router.add_post("/", handler)
    client = TestClient(TestServer(app))
    await client.start_server()

    async def send(data):
        response = await client.post("/", data=data)
        return response.status, await response.json()

    yield send
    await client.close()


async def test_read_json_answers_a_body_within_its_limits(post):
    assert await post(b'{"a": [1, 2]}') == (200, {"body": {"a": [1, 2]}})


async def test_read_json_refuses_a_declared_length_over_the_limit(post):
    status, answer = await post(b" " * ((1 << 20) + 1))
    assert status == 413
    assert answer["error"] == "the request body is 1048577 bytes; this server takes at most 1048576 bytes (1 MiB)"


async def test_read_json_refuses_a_streamed_body_once_it_passes_the_limit(post):
    async def chunks():  # no Content-Length: counted while read
        for _ in range(4):
            yield b" " * (300 * 1024)

    status, answer = await post(chunks())
    assert status == 413
    assert answer["error"] == "the request body is over 1048576 bytes (1 MiB), the most this server takes"


async def test_read_json_refuses_deep_nesting_with_a_400(post):
    status, answer = await post(deep(100_000))
    assert status == 400 and f"more than {MAX_DEPTH} levels deep" in answer["error"]


async def test_read_json_gives_up_on_a_body_that_trickles_in(post, monkeypatch):
    from agent.serving import body

    monkeypatch.setattr(body, "BODY_TIMEOUT_S", 0.3)

    async def trickle():  # a byte now and then: it would hold the handler and its connection for ever
        for _ in range(100):
            yield b" "
            await asyncio.sleep(0.1)

    status, answer = await post(trickle())
    assert status == 408 and answer["error"].startswith("the request body did not arrive within 0.3 s")
