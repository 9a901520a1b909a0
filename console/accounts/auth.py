from __future__ import annotations

from ninja.security import HttpBearer

from console.accounts.models import ApiToken


class BearerToken(HttpBearer):
    """`Authorization: Bearer <token>` checked against the hashed API tokens."""

    def authenticate(self, request, token: str):
        row = ApiToken.authenticate(token)
        if row is None:
            return None
        request.user = row.user
        return row.user
