"""The audit trail: the timeline's changes made by people and their tokens (console/accounts/auth.py actor_of, the
Django admin's, management commands'), not the scheduler's, the agents' or the console's own. One filter shared by
the audit page and GET /api/v1/audit: who (a user, with their tokens), what kind of object, and a time range."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from console.accounts.scope import TeamScope
from console.events.models import Event
from console.events.query import parse_since, refused

# What people change, as the timeline names objects ("scheduler" is the placement strategy, one object).
KINDS = ("deployment", "model", "adapter", "route", "token", "team", "host", "alert", "scheduler")
# The actors that are people: a session ("user NAME"), a token ("token NAME (USER)"), either of those in the
# Django admin (" (admin)" after), and a management command run at a shell ("manage.py COMMAND (ACCOUNT)").
PEOPLE = Q(actor__startswith="user ") | Q(actor__startswith="token ") | Q(actor__startswith="manage.py ")
USER_NAME = re.compile(r"[\w.@+-]{1,150}")  # what Django's username validator allows


@dataclass(frozen=True)
class AuditFilter:
    """`who`: a user name (their own changes and their tokens'); `kind`: one of KINDS; `since`/`until`: times."""

    who: str = ""
    kind: str = ""
    since: datetime | None = None
    until: datetime | None = None


def audit_filter(who: str = "", kind: str = "", since: str = "", until: str = "") -> AuditFilter:
    """The filter from query parameters, or Invalid naming the first one at fault."""
    who, kind = who.strip(), kind.strip()
    if who and not USER_NAME.fullmatch(who):
        raise refused("who", f"{who[:150]!r} is not a user name (letters, digits and @.+-_, up to 150)")
    if kind and kind not in KINDS:
        raise refused("kind", f"{kind[:40]!r} is not one of {', '.join(KINDS)}")
    f = AuditFilter(who, kind, parse_since(since), parse_since(until, "until"))
    if f.since and f.until and f.until < f.since:
        raise refused("until", "is before since: no change can be in that range")
    return f


def audited(f: AuditFilter, scope: TeamScope) -> QuerySet[Event]:
    """People's changes matching `f` that `scope` may read (as the events page shows them), newest first."""
    rows = Event.objects.filter(PEOPLE)
    if f.who:
        rows = rows.filter(by_user(f.who))
    if f.kind == "scheduler":
        rows = rows.filter(object="scheduler")
    elif f.kind:
        rows = rows.filter(object__startswith=f"{f.kind}/")
    if f.since is not None:
        rows = rows.filter(last_seen__gte=f.since)
    if f.until is not None:
        rows = rows.filter(last_seen__lte=f.until)
    return scope.events(rows).order_by("-last_seen", "-id")


def by_user(name: str) -> Q:
    """The actors that are `name`: their session and each of their tokens, in the admin too."""
    return (Q(actor=f"user {name}") | Q(actor=f"user {name} (admin)")
            | Q(actor__startswith="token ", actor__endswith=f" ({name})")
            | Q(actor__startswith="token ", actor__endswith=f" ({name}) (admin)"))

