"""Bearer tokens: random, shown once, stored as a SHA-256 hash with a short lookup prefix.

The tokens carry 256 bits of entropy, so a fast hash is enough (no password stretching needed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX_LEN = 8


def new_token(kind: str) -> str:
    """A fresh token like `mg_api_<prefix><secret>`; the kind is for humans reading logs."""
    return f"mg_{kind}_{secrets.token_urlsafe(32)}"


def token_prefix(token: str) -> str:
    return token.rsplit("_", 1)[-1][:PREFIX_LEN] if "_" in token else token[:PREFIX_LEN]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), stored_hash)
