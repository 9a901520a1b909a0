from __future__ import annotations

from ninja.errors import AuthenticationError, AuthorizationError
from ninja.security import HttpBearer

from console.accounts.models import ApiToken, Scope

INFERENCE_ONLY = ("this token may only call the inference gateway (scope inference); "
                  "use a token with scope all for the REST API")


class BearerToken(HttpBearer):
    """`Authorization: Bearer <token>` checked against the hashed API tokens. A token of another scope is
    refused with 403 (it is known, just not allowed here), an expired or revoked one with 401 saying so, an
    unknown one falls through to 401."""

    def authenticate(self, request, token: str):
        row, refused = ApiToken.verify(token)
        if row is None:
            return None
        if refused:
            raise AuthenticationError(message=refused)
        if row.scope != Scope.ALL:
            # Raising ends the auth chain: a script that sent a token meant it, even with a session cookie.
            raise AuthorizationError(message=INFERENCE_ONLY)
        request.user = row.user
        request.api_token = row  # who acted, for the timeline (actor_of)
        return row.user


def actor_of(request) -> str:
    """Who made a request, as the timeline names them: "token NAME (USER)" or "user NAME"."""
    token = getattr(request, "api_token", None)
    if token is not None:
        return f"token {token.name} ({token.user.get_username()})"
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user {user.get_username()}"
    return "anonymous"
