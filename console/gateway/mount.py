"""Which HTTP paths the gateway serves in the console's ASGI process: inference and metrics."""

from __future__ import annotations

GATEWAY_PREFIXES = ("/v1/", "/v2/", "/metrics/")
# "/v1" itself is no route, but the gateway's JSON 404 answers it (Django's would be an HTML page).
GATEWAY_PATHS = ("/v1", "/v2", "/metrics", "/health", "/tokenize", "/detokenize")  # the last three: as vLLM serves them


class GatewayPaths:
    """An ASGI router: /v1, /v1/..., /v2, /v2/..., /metrics, /metrics/..., /health, /tokenize and /detokenize to the
    gateway app, the rest to Django."""

    def __init__(self, gateway, django) -> None:
        self.gateway, self.django = gateway, django

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if path.startswith(GATEWAY_PREFIXES) or path in GATEWAY_PATHS:
            await self.gateway(scope, receive, send)
        else:
            await self.django(scope, receive, send)
