"""Who a browser socket's session signs in now, and which teams' data it may show: read at connect, and read again
whenever membership, a user or a session changes (Django's signals, received here: the accounts app announces
nothing itself and imports nothing of realtime), so a socket opened before a member left a team stops showing it.

The one place realtime asks for a user's team scope: it comes from console/accounts/scope.py, as every page's
does."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from console.accounts.models import Team
from console.accounts.scope import TeamScope
from console.control import layer


@dataclass(frozen=True)
class Access:
    user_id: int
    scope: TeamScope


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
    return Access(user.pk, TeamScope.of(user))


def session_digest(session_key: str) -> str:
    """What names a session in a channel-layer message: never its key."""
    return hashlib.sha256(session_key.encode()).hexdigest()


def _recheck(user_ids, ended: tuple[str, ...] = ()) -> None:
    ids = None if user_ids is None else frozenset(user_ids)
    transaction.on_commit(lambda: layer.recheck_browsers(ids, ended))  # at once outside a transaction


def _members_changed(sender, instance, action: str, reverse: bool, pk_set, **kwargs) -> None:
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    if reverse:  # user.teams.add(...): one user
        _recheck([instance.pk])
    elif action == "post_clear":  # team.members.clear(): whoever they were
        _recheck(None)
    else:
        _recheck(pk_set)


def _user_saved(sender, instance, created: bool, update_fields=None, raw: bool = False, **kwargs) -> None:
    # Each sign-in saves last_login, which changes no access.
    if not created and not raw and set(update_fields or ()) != {"last_login"}:
        _recheck([instance.pk])


def _user_deleted(sender, instance, **kwargs) -> None:
    _recheck([instance.pk])


def _signed_out(sender, request, user, **kwargs) -> None:
    # Sent before the session is flushed, so a check now would still find it: its sockets are named instead.
    key = getattr(getattr(request, "session", None), "session_key", None)
    _recheck([user.pk] if user is not None else [], (session_digest(key),) if key else ())


def connect_signals() -> None:
    """Re-check the browser sockets of whoever's access may have changed (the realtime app's ready())."""
    user_model = settings.AUTH_USER_MODEL
    m2m_changed.connect(_members_changed, sender=Team.members.through, dispatch_uid="realtime.members")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="realtime.user_saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="realtime.user_deleted")
    user_logged_out.connect(_signed_out, dispatch_uid="realtime.signed_out")
