"""Who a browser socket's session signs in now, and which teams' data it may show.

The one place realtime asks for a user's teams (teams_of): where team scope comes from is decided in
console/accounts/teams.py."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib import auth

from console.accounts.teams import Teams, teams_of


@dataclass(frozen=True)
class Access:
    user_id: int
    teams: Teams  # None: every team's (admins)


def access_of(session_key: str | None) -> Access | None:
    """Whom the session `session_key` signs in now, and their teams; None when it signs no one in: no such session
    or an expired one, signed out, a password changed since, a user deactivated or deleted (Django's own check, as
    for a page request). Sync: it reads the database."""
    if not session_key:
        return None
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = auth.get_user(SimpleNamespace(session=session))
    if not user.is_authenticated:
        return None
    return Access(user.pk, teams_of(user))


def session_digest(session_key: str) -> str:
    """What names a session in a channel-layer message: never its key."""
    return hashlib.sha256(session_key.encode()).hexdigest()
