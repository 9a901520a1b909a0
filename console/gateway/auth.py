"""Bearer tokens on the gateway: the REST API's tokens, any scope. Lookups are cached briefly in memory, so
a request costs one hash and one dict read, not a database round trip; a revoked token stops working
within CACHE_SECONDS."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from console.accounts.auth import token_scope
from console.accounts.tokens import hash_token

CACHE_SECONDS = 10.0
MAX_ENTRIES = 10_000  # bounded: unknown tokens are cached too, so a flood of bad ones cannot grow it forever


@dataclass(frozen=True)
class Caller:
    token_key: str  # a hash of the token: what limits and logs use, never the token itself
    user: str
    scope: str


def lookup(token: str) -> Caller | None:
    """The caller a token belongs to (sync, DB)."""
    found = token_scope(token)
    if found is None:
        return None
    user, scope = found
    return Caller(hash_token(token)[:16], user.get_username(), scope)


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
