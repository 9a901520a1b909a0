"""Reading the timeline, newest first, a page at a time: filters (object, type, reason, since) and an opaque
cursor (the last row's time and key), so every page is one indexed range read however deep it goes."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Case, Q, QuerySet, Value, When
from django.db.models.functions import Concat, Greatest, StrIndex, Substr
from django.utils.dateparse import parse_datetime

from console.errors import Invalid
from console.events.models import Event

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
KINDS = ("deployment", "replica", "host", "model", "adapter", "route", "token", "alert")


@dataclass(frozen=True)
class EventFilter:
    """Which events: `object` like deployment/NAME (its replicas' events too), host/NAME (and its replicas'
    there), replica/NAME#INDEX, model/NAME; `type` Normal or Warning; `reason` a code; `since` a time."""

    object: str = ""
    type: str = ""
    reason: str = ""
    since: datetime | None = None


def matching(f: EventFilter) -> QuerySet[Event]:
    rows = Event.objects.all()
    if "\x00" in f.object + f.reason:  # no event holds a NUL, and PostgreSQL refuses one in a query
        return rows.none()
    if f.object:
        kind, _, name = f.object.partition("/")
        if kind not in KINDS or not name:
            raise refused("object", f"{f.object!r} is not KIND/NAME with KIND one of {', '.join(KINDS)}")
        if kind == "deployment":
            rows = rows.filter(deployment=name)
        elif kind == "host":
            rows = rows.filter(host=name)
        else:
            rows = rows.filter(object=f.object)
    if f.type:
        rows = rows.filter(type=f.type)
    if f.reason:
        rows = rows.filter(reason=f.reason)
    if f.since is not None:
        rows = rows.filter(last_seen__gte=f.since)
    return rows


def within(rows: QuerySet[Event], teams: frozenset[int] | None) -> QuerySet[Event]:
    """`rows` without the events of other teams' deployments (and their replicas), models, adapters, routes and teams
    (console/accounts/teams.py), and of tokens of users in none of `teams`; None: every team's (admins)."""
    if teams is None:
        return rows
    from console.accounts.models import Team  # the timeline is written by every app: read theirs only here
    from console.catalog.models import Adapter, Model
    from console.deployments.models import Deployment
    from console.routes.models import Route

    def others(model, kind: str, team: str = "team_id") -> QuerySet:
        return (model.objects.order_by().exclude(**{f"{team}__in": teams})
                .annotate(key=Concat(Value(f"{kind}/"), "name")).values("key"))

    rows = rows.exclude(deployment__in=Deployment.objects.order_by().exclude(team_id__in=teams).values("name"))
    for model, kind, team in ((Model, "model", "team_id"), (Adapter, "adapter", "team_id"), (Route, "route", "team_id"),
                              (Team, "team", "pk")):
        rows = rows.exclude(object__in=others(model, kind, team))
    return _without_strangers_tokens(rows, teams)


def _without_strangers_tokens(rows: QuerySet[Event], teams: frozenset[int]) -> QuerySet[Event]:
    """`rows` without the events of tokens (token/USER/NAME) of users who share none of `teams`: a token is its
    user's, and another team's user's token names are theirs to know."""
    from django.contrib.auth import get_user_model

    strangers = get_user_model().objects.order_by().exclude(teams__in=teams).values("username")
    # A user name holds no "/" (Django's validator), so USER runs from after "token/" to the next "/"; only token
    # events are cut (a negative length is an error on PostgreSQL).
    user = Case(When(object__startswith="token/", then=Substr(
        "object", 7, Greatest(StrIndex(Substr("object", 7), Value("/")) - 1, Value(0)))), default=Value(""))
    return rows.alias(token_user=user).exclude(object__startswith="token/", token_user__in=strangers)


def page(f: EventFilter, cursor: str = "", limit: int = DEFAULT_LIMIT,
         teams: frozenset[int] | None = None) -> tuple[list[Event], str | None]:
    """Up to `limit` events after `cursor` (newest first) of `teams`' objects (see within), and the cursor of the
    next page (None: no more)."""
    rows = within(matching(f), teams).order_by("-last_seen", "-id")
    if cursor:
        at, key = decode_cursor(cursor)
        rows = rows.filter(Q(last_seen__lt=at) | Q(last_seen=at, id__lt=key))
    found = list(rows[:limit + 1])
    more = len(found) > limit
    found = found[:limit]
    return found, encode_cursor(found[-1]) if more else None


def encode_cursor(event: Event) -> str:
    raw = f"{event.last_seen.isoformat()}|{event.pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, key = text.rsplit("|", 1)
        when = parse_datetime(at)
        if when is None:
            raise ValueError(at)
        return when, int(key)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise refused("cursor", "not a cursor this API gave (take it from a page's `next`)") from None


def parse_since(value: str, param: str = "since") -> datetime | None:
    """`since` (or `param`) as unix seconds or ISO 8601 (a time without zone is UTC); empty: None."""
    value = value.strip()
    if not value:
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        when = parse_datetime(value)
    except ValueError:
        when = None
    if when is None:
        raise refused(param, f"{value!r} is neither unix seconds nor an ISO 8601 time")
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def refused(param: str, why: str) -> Invalid:
    return Invalid(f"{param}: {why}", errors=[{"loc": ["query", param], "msg": why, "type": "invalid"}])
