"""Only the console's gateway may use the agent's inference port: every route but GET /v2/health/live
needs `Authorization: Bearer <gateway secret>`, the per-host secret the console sends in each desired state.

The secret lives in a GatewayAuth the app is given (the Agent sets it from each desired state it applies;
tests set it themselves). It is held in memory only. Checking a request costs one header read and one
hmac.compare_digest.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger(__name__)

OPEN_PATH = "/v2/health/live"  # liveness probes stay open: the answer reveals nothing
OPEN_METHODS = ("GET", "HEAD")
WRONG_SECRET = (
    "this agent serves only the ModelGrid console's gateway: send the gateway's secret as a bearer token "
    "(Authorization: Bearer <secret>)"
)
NO_SECRET_YET = (
    "this agent serves only the ModelGrid console's gateway, and it has no gateway secret yet: it has not "
    "received one in a desired state from the console"
)
_SCHEME = "bearer "

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refusal = Callable[[web.Request, str, str], web.StreamResponse]  # (request, message, code) -> the 401


class GatewayAuth:
    """The gateway's current secret for this host; `set` replaces it (the console rotates it with the agent
    token). With no secret (none received yet, or an empty one) every request is refused."""

    def __init__(self, secret: str = "") -> None:
        self._secret: bytes = b""
        self.set(secret)

    def set(self, secret: str) -> None:
        """Take `secret` as the only one accepted from now on ("" accepts none)."""
        new = secret.encode("utf-8")
        if new != self._secret:
            log.info("gateway secret %s", "replaced" if self._secret else "received" if new else "cleared")
        self._secret = new

    @property
    def configured(self) -> bool:
        return bool(self._secret)

    def accepts(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries the current secret as a bearer token."""
        secret = self._secret
        if not secret or authorization is None or authorization[:7].lower() != _SCHEME:
            return False
        return hmac.compare_digest(authorization[7:].encode("utf-8", "surrogateescape"), secret)


def gateway_only(auth: GatewayAuth, refuse: Refusal) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The middleware: a request without the current secret gets `refuse(request, message, code)`, a 401."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if auth.accepts(request.headers.get("Authorization")):
            return await handler(request)
        if request.path == OPEN_PATH and request.method in OPEN_METHODS:
            return await handler(request)
        if auth.configured:
            return refuse(request, WRONG_SECRET, "invalid_gateway_secret")
        return refuse(request, NO_SECRET_YET, "no_gateway_secret")

    return middleware
