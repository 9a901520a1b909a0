"""Talking to agents: one pooled keep-alive HTTP client per console process, the host's gateway secret on
every request, and the line between "never reached the replica" (safe to retry elsewhere) and everything
after the first byte (never retried: the replica may have acted on it)."""

from __future__ import annotations

import asyncio

import aiohttp

from agent.protocol import REPLICA_HEADER
from console.gateway.fleet import ReplicaView

CONNECT_TIMEOUT_S = 5.0
# Triton's binary tensor extension: the length of the JSON header before a body's raw tensor bytes, both ways.
INFERENCE_HEADER_LENGTH = "inference-header-content-length"
PASSED_HEADERS = ("content-type", "retry-after", INFERENCE_HEADER_LENGTH)


class Unreachable(Exception):
    """The replica's agent could not be reached before it sent anything back."""


class Upstream:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # No total timeout: a long generation is the replica's business, and the client's disconnect
            # cancels it. Connecting is bounded so a dead host is found out quickly and retried elsewhere.
            timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S)
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
