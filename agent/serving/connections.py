"""A bound on the agent's inference connections: aiohttp takes connections until the process runs out of
descriptors, which its workers' pipes and logs need too. At `limit` open connections, the oldest one idle (no
request in progress) is closed to admit the new one; with every one busy, the new one is closed. Idle and slow
connections are closed by the keep-alive timeout and the body timeout (agent.serving.server, agent.serving.body)."""

from __future__ import annotations

import asyncio
import resource
from collections import OrderedDict
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler


def default_limit() -> int:
    """Half of what the process may open: the rest is for its workers' connections, logs and the console link."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, soft // 2)


class _GuardedServer(web.Server):
    """aiohttp's server (as the application makes it) with the bound: `guard` turns one into this."""

    _limit: int
    _order: OrderedDict[RequestHandler, None]  # open connections, by when they opened, oldest first
    evicted: int

    @classmethod
    def guard(cls, server: web.Server, limit: int) -> _GuardedServer:
        server.__class__ = cls
        server._limit, server._order, server.evicted = limit, OrderedDict(), 0
        return server

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._order[handler] = None
        while len(self._order) > self._limit:
            idle = next((h for h in self._order if h is not handler and not _busy(h)), None)
            victim = idle or handler  # every other one busy: the newcomer goes
            self._order.pop(victim, None)
            self.evicted += idle is not None
            victim.force_close()
            if victim.transport is not None:
                victim.transport.close()
            if victim is handler:
                return

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._order.pop(handler, None)
        super().connection_lost(handler, exc)


def _busy(handler: RequestHandler) -> bool:
    # aiohttp's own flag (a private one: a version without it counts every connection busy, closing newcomers)
    return getattr(handler, "_request_in_progress", True)


class GuardedRunner(web.AppRunner):
    """web.AppRunner whose server holds at most `limit` connections (default: half the descriptor limit)."""

    def __init__(self, app: web.Application, *, limit: int | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._connection_limit = limit or default_limit()

    async def _make_server(self) -> web.Server:
        return _GuardedServer.guard(await super()._make_server(), self._connection_limit)
