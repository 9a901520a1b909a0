"""Bearer tokens on the gateway: the REST API's tokens, any scope. Lookups are cached briefly in memory, so
a request costs one hash and one dict read, not a database round trip; a revoked token stops working
within CACHE_SECONDS, an expired one at once (the cached caller carries its expiry). The caller carries its
user's teams too (console/accounts/teams.py), and its token's rate limits: a change of either reaches the gateway
within CACHE_SECONDS."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from console.accounts import expiry
from console.accounts.models import ApiToken
from console.accounts.teams import teams_of
from console.accounts.tokens import hash_token
from console.gateway.errors import NO_TOKEN

CACHE_SECONDS = 10.0
MAX_ENTRIES = 10_000  # bounded: unknown tokens are cached too, so a flood of bad ones cannot grow it forever
SHOWN_DEPLOYMENTS = 10  # a refusal names at most this many of the deployments a token may call


@dataclass(frozen=True)
class Caller:
    token_key: str  # a hash of the token: what limits and logs use, never the token itself
    user: str
    scope: str
    deployments: frozenset[str] = frozenset()  # the deployments it may call; empty: all
    expires: datetime | None = None
    label: str = ""  # its name and prefix, for refusals
    refused: str = ""  # why it may not be used at all (revoked, expired when looked up); "" when it may
    teams: frozenset[int] | None = None  # its user's teams, whose deployments it may call; None: all (admins)
    token_id: int = 0  # the ApiToken's primary key: what usage is accounted under
    rpm_limit: int | None = None  # the token's own limits (console/gateway/limits.py); None: none
    tpm_limit: int | None = None

    def refusal(self, now: datetime) -> str:
        """Why the token is refused now (401), or "": checked on every request, so the cache never outlives an
        expiry."""
        if self.refused:
            return self.refused
        if self.expires is not None and self.expires <= now:
            return expiry.expired(self.label, self.expires)
        return ""

    def in_team(self, team: int) -> bool:
        """Whether a deployment of `team` is one this token may even know of (else: 404, as if it did not exist)."""
        return self.teams is None or team in self.teams

    def may_call(self, deployment: str) -> bool:
        return not self.deployments or deployment in self.deployments

    def forbidden(self, deployment: str) -> str:
        """Why this token may not call `deployment` (403)."""
        names = sorted(self.deployments)
        shown = ", ".join(names[:SHOWN_DEPLOYMENTS]) + (f" and {len(names) - SHOWN_DEPLOYMENTS} more"
                                                         if len(names) > SHOWN_DEPLOYMENTS else "")
        return (f"this token may not call deployment {deployment!r}: it may only call {shown}; ask for a token "
                "with that deployment (Tokens page, POST /api/v1/tokens)")


def unauthorized(caller: Caller | None, now: datetime) -> str:
    """Why a request from `caller` (None: no token, or one nobody has) is refused with 401 now, or ""."""
    return NO_TOKEN if caller is None else caller.refusal(now)


def lookup(token: str) -> Caller | None:
    """The caller a token belongs to, refused or not; None for a token nobody has (sync, DB)."""
    row, refused = ApiToken.verify(token)
    if row is None:
        return None
    return Caller(hash_token(token)[:16], row.user.get_username(), row.scope, frozenset(row.deployments),
                  row.expires, row.label, refused, teams_of(row.user), row.pk, row.rpm_limit, row.tpm_limit)


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class TokenCache:
    """token hash -> (caller or None, expiry), filled through `fetch` (the DB lookup, run off the loop)."""

    def __init__(self, fetch: Callable[[str], Awaitable[Caller | None]]) -> None:
        self._fetch = fetch
        self._entries: dict[str, tuple[Caller | None, float]] = {}

    async def caller(self, token: str) -> Caller | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        found = await self._fetch(token)
        if len(self._entries) >= MAX_ENTRIES:
            self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
        self._entries[key] = (found, now + CACHE_SECONDS)
        return found
