"""Bounds on the console's HTTP connections, as uvicorn's HTTP protocol with guards (used by `manage.py up`).

uvicorn closes a keep-alive connection idle past its timeout, but not one that never sends a request, sends
its headers a byte a minute, or trickles its body; and it takes connections until the process runs out of
descriptors. 20,600 idle connections did exactly that: every request failed and SQLite could not open its
files. So here a connection must send a request's headers within `header_timeout` of opening (or of its last
response) and its body within `body_timeout` of its headers, and when the open HTTP connections reach `limit`,
the one waiting longest for its next request is closed to admit the new one. Websockets (agent links,
dashboards) leave this count once upgraded; they live as long as their peers keep them.
"""

from __future__ import annotations

import asyncio
import resource
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0


def server_options() -> dict[str, Any]:
    """What `up` gives uvicorn.Config from the settings: these bounds, and whose X-Forwarded-For it believes (only
    the proxies named in FORWARDED_ALLOW_IPS; uvicorn's own default trusts loopback, every client of `up`)."""
    from django.conf import settings

    allowed = settings.FORWARDED_ALLOW_IPS
    return {"http": guarded_http(settings.MODELGRID_MAX_CONNECTIONS or None, settings.MODELGRID_HEADER_TIMEOUT_SECONDS,
                                 settings.MODELGRID_BODY_TIMEOUT_SECONDS),
            "proxy_headers": bool(allowed), "forwarded_allow_ips": allowed or None}


def default_limit() -> int:
    """Half of what the process may open: the rest is for its database, Redis, agent links and files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, soft // 2)


def raise_descriptor_limit() -> int:
    """Lift the soft limit on open descriptors to the hard one (many hosts start at 1,024); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


class _Registry:
    """The HTTP connections of one server: all of them, and those waiting for a request, oldest first."""

    def __init__(self) -> None:
        self.open: set[Any] = set()
        self.waiting: OrderedDict[Any, None] = OrderedDict()
        self.evicted = 0  # connections closed to admit newer ones (for tests and logs)


def guarded_http(limit: int | None = None, header_timeout: float = HEADER_TIMEOUT_S,
                 body_timeout: float = BODY_TIMEOUT_S) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with these bounds (pass it as `uvicorn.Config(http=...)`)."""
    cap = limit or default_limit()

    class GuardedHttp(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._timer: asyncio.TimerHandle | None = None
            registry = self._registry = _registry_of(self.server_state)
            while len(registry.open) >= cap and registry.waiting:
                oldest, _ = registry.waiting.popitem(last=False)
                registry.open.discard(oldest)
                registry.evicted += 1
                oldest.transport.close()
            if len(registry.open) >= cap:  # every one of them is busy with a request: no room
                transport.close()
                return
            registry.open.add(self)
            self._wait_for("headers", header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            self._forget()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._registry.waiting.pop(self, None)
            self._wait_for("body", body_timeout)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._cancel()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Waiting for its next request, unless a pipelined one has just started (its cycle is not done).
            if (not self.transport.is_closing() and self in self._registry.open
                    and (self.cycle is None or self.cycle.response_complete)):
                self._wait_for("headers", header_timeout)

        def handle_websocket_upgrade(self) -> None:
            self._forget()  # a websocket now: its own protocol owns the connection
            super().handle_websocket_upgrade()

        def _wait_for(self, what: str, seconds: float) -> None:
            self._cancel()
            if what == "headers":
                self._registry.waiting[self] = None
            self._timer = self.loop.call_later(seconds, self._too_slow)

        def _too_slow(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def _cancel(self) -> None:
            if getattr(self, "_timer", None) is not None:
                self._timer.cancel()
                self._timer = None

        def _forget(self) -> None:
            self._cancel()
            registry = getattr(self, "_registry", None)
            if registry is not None:
                registry.open.discard(self)
                registry.waiting.pop(self, None)

    GuardedHttp.limit = cap  # type: ignore[attr-defined]
    return GuardedHttp


def _registry_of(server_state: Any) -> _Registry:
    registry = getattr(server_state, "modelgrid_connections", None)
    if registry is None:
        registry = server_state.modelgrid_connections = _Registry()
    return registry
