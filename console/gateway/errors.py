"""How each API family words a refusal: OpenAI's error object on /v1, `{"error": "..."}` on /v2, with
`Retry-After` when waiting helps and `WWW-Authenticate` on 401."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

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
