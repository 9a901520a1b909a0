"""How each API family words a refusal: OpenAI's error object on /v1, `{"error": "..."}` on /v2, with
`Retry-After` when waiting helps and `WWW-Authenticate` on 401; the gateway's own 404, 405 and 500 too."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus

from starlette.responses import JSONResponse, Response

log = logging.getLogger("modelgrid.gateway")

OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


class Family:
    """One API family's error shape."""

    def __init__(self, openai: bool) -> None:
        self.openai = openai

    def error(self, status: int, message: str, code: str = "", retry_after: float | None = None) -> Response:
        if self.openai:
            kind = OPENAI_TYPES.get(status, "server_error")
            body = {"error": {"message": message, "type": kind, "param": None, "code": code or None}}
        else:
            body = {"error": message}
        headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else {}
        if status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(body, status_code=status, headers=headers)


OPENAI, V2 = Family(True), Family(False)
NO_TOKEN = ("a valid API token is required: send 'Authorization: Bearer <token>' "
            "(python manage.py createapitoken NAME --scope inference)")


def family_of(path: str) -> Family:
    """The error shape a path's clients expect: OpenAI's under /v1 and on vLLM's own /tokenize and /detokenize,
    `{"error"}` elsewhere (/v2, /metrics, /health)."""
    return OPENAI if path == "/v1" or path.startswith(("/v1/", "/tokenize", "/detokenize")) else V2


def http_error(family: Family, method: str, path: str, status: int, headers: Mapping[str, str] | None) -> Response:
    """The gateway's own 404 (no such path) and 405 (not with this method), in the family's shape, `Allow` kept."""
    if status == 404:
        message, code = f"no such path: {method} {path}" + _WHERE.get(family.openai, ""), "not_found"
    elif status == 405:
        allowed = (headers or {}).get("Allow", "")
        message, code = f"{method} is not allowed on {path}; it takes {allowed or 'other methods'}", \
            "method_not_allowed"
    else:
        message, code = f"{HTTPStatus(status).phrase}: {method} {path}", ""
    response = family.error(status, message, code)
    if headers and "Allow" in headers:
        response.headers["Allow"] = headers["Allow"]
    return response


def server_error(family: Family, method: str, path: str, error: Exception) -> Response:
    """A failure of the gateway's own (a bug): logged with its traceback; the client gets JSON, not a text page."""
    log.error("%s %s failed", method, path, exc_info=error)
    return family.error(500, "internal error in the console's gateway: the console logged it", "server_error")


_WHERE = {True: "; the OpenAI-compatible API serves /v1/models, /v1/completions, /v1/chat/completions, "
                "/v1/embeddings and /v1/responses",
          False: "; the v2 API serves /v2, /v2/health/{live,ready}, /v2/repository/index and "
                 "/v2/models/{name}[/versions/1][/ready|/config|/infer]"}
