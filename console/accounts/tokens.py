"""Bearer tokens: random, shown once, stored as a SHA-256 hash with a short lookup prefix.

The tokens carry 256 bits of entropy, so a fast hash is enough (no password stretching needed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX_LEN = 8


def new_token(kind: str) -> str:
    """A fresh token like `mg_api_<secret>`; the kind is for humans reading logs, and holds no `_`."""
    return f"mg_{kind}_{secrets.token_urlsafe(32)}"


def token_prefix(token: str) -> str:
    """The first PREFIX_LEN characters of the secret, what follows `mg_<kind>_` (the secret's own `_` and `-`
    included): what lists show to recognise a token by, and the key it is looked up by."""
    parts = token.split("_", 2)
    secret = parts[2] if len(parts) == 3 and parts[0] == "mg" else token
    return secret[:PREFIX_LEN]


def legacy_prefix(token: str) -> str:
    """The prefix tokens were stored under before token_prefix: after the token's last `_`, which for a secret that
    holds one is not the secret's start. Kept so those tokens still authenticate."""
    return token.rsplit("_", 1)[-1][:PREFIX_LEN] if "_" in token else token[:PREFIX_LEN]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), stored_hash)
