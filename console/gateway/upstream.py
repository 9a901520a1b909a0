"""Talking to agents: one pooled keep-alive HTTP client per console process, the host's gateway secret on
every request, and the line between "never reached the replica" (safe to retry elsewhere) and everything
after the first byte (never retried: the replica may have acted on it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp

from agent.protocol import REPLICA_HEADER
from console.gateway.fleet import ReplicaView

CONNECT_TIMEOUT_S = 5.0
DONE = b"data: [DONE]\n\n"
# Triton's binary tensor extension: the length of the JSON header before a body's raw tensor bytes, both ways.
INFERENCE_HEADER_LENGTH = "inference-header-content-length"
PASSED_HEADERS = ("content-type", "retry-after", INFERENCE_HEADER_LENGTH)


class Unreachable(Exception):
    """The replica's agent could not be reached before it sent anything back."""


class Broken(Exception):
    """An answer that stopped coming after it had begun: its connection broke, or nothing came for too long."""


async def pieces(response: aiohttp.ClientResponse, idle_s: float) -> AsyncIterator[bytes]:
    """A response's body as it comes; Broken when its connection breaks off or nothing comes for `idle_s` seconds
    (a paused agent sends nothing and keeps its connection open)."""
    while True:
        try:
            async with asyncio.timeout(idle_s):
                piece = await response.content.readany()
        except TimeoutError:
            raise Broken(f"sent nothing for {idle_s:g} s") from None
        except aiohttp.ClientError as e:
            raise Broken(f"broke off its answer ({e or type(e).__name__})") from e
        if not piece:
            return
        yield piece


def error_event(message: str, code: str) -> bytes:
    """A stream's end after a failure, as vLLM and the agents end theirs: an OpenAI error object as the last event,
    then `[DONE]` (the official client raises on the error; one that reads to `[DONE]` still ends)."""
    error = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + json.dumps(error).encode() + b"\n\n" + DONE


class Upstream:
    def __init__(self, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # No total timeout: a long generation is the replica's business, and the client's disconnect
            # cancels it. Connecting is bounded so a dead host is found out quickly and retried elsewhere; the
            # wait for an answer and the gaps in a stream are bounded by the gateway (proxy.py, pieces()).
            timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s)
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
            # No cookies between the gateway and agents: a dummy jar skips that work on every request.
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
            self._loop = loop
        return self._session

    async def send(self, replica: ReplicaView, method: str, path: str, body: bytes,
                   content_type: str | None, header_length: str | None = None) -> aiohttp.ClientResponse:
        """The agent's response, headers read and body not yet; Unreachable if nothing came back.
        `header_length`: the request's Inference-Header-Content-Length, passed on."""
        return await self.request(replica.endpoint, replica.secret, replica.label, method, path, body, content_type,
                                  replica.id, header_length)

    async def request(self, endpoint: str, secret: str, label: str, method: str, path: str, body: bytes = b"",
                      content_type: str | None = None, replica_id: int | None = None,
                      header_length: str | None = None) -> aiohttp.ClientResponse:
        """As send(), to the agent at `endpoint` holding `secret`; `label` names it in the Unreachable. With
        `replica_id`, the agent serves that replica or refuses (the gateway routes once)."""
        headers = {"Authorization": f"Bearer {secret}"}
        if replica_id is not None:
            headers[REPLICA_HEADER] = str(replica_id)
        if content_type:
            headers["Content-Type"] = content_type
        if header_length is not None:
            headers[INFERENCE_HEADER_LENGTH] = header_length
        try:
            return await self.session().request(method, endpoint + path, data=body or None, headers=headers)
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            raise Unreachable(f"{label} at {endpoint}: {e or type(e).__name__}") from e

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
