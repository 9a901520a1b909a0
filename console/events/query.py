"""Reading the timeline, newest first, a page at a time: filters (object, type, reason, since) and an opaque
cursor (the last row's time and key), so every page is one indexed range read however deep it goes. What a reader
may see of it is the team scope's to say (console/accounts/scope.py): every read takes one."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Q, QuerySet
from django.utils.dateparse import parse_datetime

from console.accounts.scope import TeamScope
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


def page(f: EventFilter, scope: TeamScope, cursor: str = "", limit: int = DEFAULT_LIMIT
         ) -> tuple[list[Event], str | None]:
    """Up to `limit` events after `cursor` (newest first) of what `scope` may read, and the cursor of the next page
    (None: no more)."""
    rows = scope.events(matching(f)).order_by("-last_seen", "-id")
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
