"""Only the console's gateway may use the agent's inference port: every route but GET /v2/health/live
needs `Authorization: Bearer <gateway secret>`, the per-host secret the console sends in each desired state.

The secret lives in a GatewayAuth the app is given (the Agent sets it from each desired state it applies;
tests set it themselves). It is held in memory only. Checking a request costs one header read and one
hmac.compare_digest.

An operator who fronts the agents with an endpoint picker of their own (docs/inference.md) may also let in, by
PickerAccess: a token of theirs for the OpenAI routes a picker's gateway relays and the picker's metrics pages
(agent.serving.picker), and, since a stock picker scrapes without credentials, those metrics pages with none.
Neither is on unless the agent is started so (agent.cli); the gateway's secret still opens everything.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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
# What a picker's gateway relays (the Model Server Protocol's inference API) and what the picker scrapes.
PICKER_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions")
PICKER_METRICS = "/msp/"

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
        return _bearer_is(authorization, self._secret)


@dataclass(frozen=True)
class PickerAccess:
    """What the operator lets an endpoint picker and its gateway use besides the console's gateway."""

    token: str = ""  # accepted as a bearer token on PICKER_PATHS and the metrics pages ("": none)
    open_metrics: bool = False  # GET on the metrics pages with no token at all

    def admits(self, request: web.Request) -> bool:
        """Whether this request may pass without the gateway's secret."""
        metrics = request.path.startswith(PICKER_METRICS) and request.method in OPEN_METHODS
        if metrics and self.open_metrics:
            return True
        if not self.token or not (metrics or request.path in PICKER_PATHS):
            return False
        return _bearer_is(request.headers.get("Authorization"), self.token.encode("utf-8"))


def gateway_only(
    auth: GatewayAuth, refuse: Refusal, picker: PickerAccess | None = None
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The middleware: a request without the current secret (and not admitted by `picker`) gets
    `refuse(request, message, code)`, a 401."""
    picker = picker or PickerAccess()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if auth.accepts(request.headers.get("Authorization")):
            return await handler(request)
        if request.path == OPEN_PATH and request.method in OPEN_METHODS:
            return await handler(request)
        if picker.admits(request):
            return await handler(request)
        if auth.configured:
            return refuse(request, WRONG_SECRET, "invalid_gateway_secret")
        return refuse(request, NO_SECRET_YET, "no_gateway_secret")

    return middleware


def _bearer_is(authorization: str | None, secret: bytes) -> bool:
    if not secret or authorization is None or authorization[:7].lower() != _SCHEME:
        return False
    return hmac.compare_digest(authorization[7:].encode("utf-8", "surrogateescape"), secret)
