"""The origin check for browser websockets, exact like Django's CSRF origin check: channels'
AllowedHostsOriginValidator compares host names only, so any port (another local service) passed it."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain


class SameOriginValidator:
    """Let a websocket handshake through only when its Origin is the console's own origin (the scheme, and the
    Host header exactly, port included; the host must be in ALLOWED_HOSTS) or in CSRF_TRUSTED_ORIGINS (where
    `https://*.example.com` covers subdomains, as for CSRF). Anything else, no Origin included, gets 403."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def origin_allowed(scope) -> bool:
    headers = _headers(scope["headers"])
    origin = headers.get("origin")
    if not origin:
        return False
    host = headers.get("host", "")
    if host and validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
        if origin == f"{_http_scheme(scope, headers)}://{host}":
            return True
    return trusted(origin, settings.CSRF_TRUSTED_ORIGINS)


def trusted(origin: str, trusted_origins: Iterable[str]) -> bool:
    """Whether `origin` is listed in CSRF_TRUSTED_ORIGINS, with Django's rules for `*.` subdomain entries."""
    trusted_origins = list(trusted_origins)
    if origin in trusted_origins:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    return any(
        is_same_domain(parsed.netloc, entry.netloc.lstrip("*"))
        for entry in (urlsplit(o) for o in trusted_origins if "*" in o)
        if entry.scheme == parsed.scheme
    )


def _http_scheme(scope, headers: dict[str, str]) -> str:
    """The scheme the browser used: wss from the server, or the TLS proxy's header (SECURE_PROXY_SSL_HEADER)."""
    if scope.get("scheme") == "wss":
        return "https"
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
        header = meta_name.removeprefix("HTTP_").replace("_", "-").lower()
        # Django takes the first value when a chain of proxies appends theirs.
        if headers.get(header, "").split(",")[0].strip() == secure_value:
            return "https"
    return "http"


def _headers(raw) -> dict[str, str]:
    # Header names arrive lower-case in ASGI; latin-1 decodes any byte, as Django does for request.META.
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in raw}
