"""The shared counts behind the gateway's limits and quotas: fixed windows (a minute; a team's quota period, UTC
calendar days, weeks from Monday, months) under keys (a token's, a team's), one LimitCounter row each. Every console
process adds what it counted since its last sync in one upsert and reads back the totals of all of them. The tokens
reserved by its requests in flight are one LimitHold row per (console, window), replaced whole at each sync, so that
the others count them and stop counting them once that console no longer syncs. Nothing here runs on a request's
path (console/gateway/limits.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Sum

from console.accounts.models import LimitCounter, LimitHold

MINUTE = 60
PERIODS = ("day", "week", "month")  # a team's tokens are counted in each, whichever its quota uses
CHUNK = 500  # windows per upsert statement, 5 parameters each: under SQLite's limit (32,766)
KEEP_S = 3600  # a window's row outlives its end this long (then a sync deletes it)

Window = tuple[str, int]  # (key, start in seconds since the epoch)


def token_key(token_id: int) -> str:
    return f"token:{token_id}"


def team_key(team_id: int) -> str:
    return f"team:{team_id}"


def quota_key(team_id: int, period: str) -> str:
    return f"quota:{team_id}:{period}"


def period_bounds(period: str, now: float) -> tuple[int, int]:
    """The UTC calendar `period` (day | week | month) that `now` falls in: its start and end, in epoch seconds."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + timedelta(days=1)
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    return int(start.timestamp()), int(end.timestamp())


def add(deltas: Mapping[Window, tuple[int, int, int]]) -> None:
    """Add this process's counts (window -> requests, tokens, the window's end) to every process's (sync, DB). The
    adds go in one transaction, CHUNK rows per statement (a long outage's windows can outnumber what one statement's
    parameters allow), rows in key order across the chunks, so that two processes' upserts lock them in one order
    and never deadlock."""
    if not deltas:
        return
    q = connection.ops.quote_name
    table, key, start, until, requests, tokens = map(q, (LimitCounter._meta.db_table, "key", "start", "until",
                                                         "requests", "tokens"))
    rows = sorted((k, s, u, r, t) for (k, s), (r, t, u) in deltas.items())
    with transaction.atomic(), connection.cursor() as cursor:
        for i in range(0, len(rows), CHUNK):  # chunks in key order too: the lock order holds across them
            part = rows[i:i + CHUNK]
            values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(part))
            # Added to, never set: `t.n + excluded.n` is what makes the counts of several processes one sum.
            sql = (f"INSERT INTO {table} ({key}, {start}, {until}, {requests}, {tokens}) "  # noqa: S608
                   f"VALUES {values} ON CONFLICT ({key}, {start}) DO UPDATE SET "
                   f"{requests} = {table}.{requests} + excluded.{requests}, "
                   f"{tokens} = {table}.{tokens} + excluded.{tokens}")
            cursor.execute(sql, [v for row in part for v in row])


def read(now: float) -> dict[Window, tuple[int, int]]:
    """Every current window's (requests, tokens) over all processes, in one statement."""
    current = LimitCounter.objects.filter(until__gt=int(now)).values_list("key", "start", "requests", "tokens")
    return {(key, start): (requests, tokens) for key, start, requests, tokens in current}


def hold(console: str, held: Mapping[Window, tuple[int, int]], stamp: float) -> None:
    """Put `console`'s reservations in flight (window -> tokens, the window's end) in place of what it held before:
    its rows are set, never added to (a sync that is repeated or lost changes nothing), and stamped `stamp` (the time,
    above its last stamp), which is what keeps them counting for the others. Rows in key order, CHUNK per statement,
    as in add()."""
    q = connection.ops.quote_name
    table, console_, key, start, until, tokens, seen = map(q, (LimitHold._meta.db_table, "console", "key", "start",
                                                              "until", "tokens", "seen"))
    rows = sorted((console, k, s, u, t, stamp) for (k, s), (t, u) in held.items())
    with transaction.atomic(), connection.cursor() as cursor:
        for i in range(0, len(rows), CHUNK):
            part = rows[i:i + CHUNK]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(part))
            sql = (f"INSERT INTO {table} ({console_}, {key}, {start}, {until}, {tokens}, {seen}) "  # noqa: S608
                   f"VALUES {values} ON CONFLICT ({console_}, {key}, {start}) DO UPDATE SET "
                   f"{tokens} = excluded.{tokens}, {seen} = excluded.{seen}")
            cursor.execute(sql, [v for row in part for v in row])
        LimitHold.objects.filter(console=console, seen__lt=stamp).delete()  # released since its last sync


def held_by_others(console: str, since: float, now: float) -> dict[Window, int]:
    """The tokens every other console holds in each current window, counting only consoles that synced since
    `since` (one that stopped syncing may have died with its requests)."""
    rows = (LimitHold.objects.filter(seen__gte=since, until__gt=int(now)).exclude(console=console)
            .values_list("key", "start").annotate(total=Sum("tokens")).order_by())
    return {(key, start): total for key, start, total in rows}


def prune(now: float) -> int:
    """Delete windows that ended more than KEEP_S ago, and the reservations of consoles that have not synced for as
    long; how many went."""
    gone = LimitHold.objects.filter(seen__lt=now - KEEP_S).delete()[0]
    return gone + LimitCounter.objects.filter(until__lt=int(now) - KEEP_S).delete()[0]


def quota_used(team_id: int, period: str, now: float) -> int:
    """Tokens a team's requests have used in its current quota period, as the consoles last synced them."""
    start, _ = period_bounds(period, now)
    row = LimitCounter.objects.filter(key=quota_key(team_id, period), start=start).values_list("tokens", flat=True)
    return next(iter(row), 0)


def quotas_used(teams: Iterable[tuple[int, str]], now: float) -> dict[int, int]:
    """quota_used() of many teams, (team id, its quota period) each, in one query: the Teams page lists them all."""
    wanted = {(quota_key(team_id, period), period_bounds(period, now)[0]): team_id for team_id, period in teams}
    rows = LimitCounter.objects.filter(key__in={key for key, _ in wanted}, until__gt=int(now))
    used = dict.fromkeys(wanted.values(), 0)
    for key, start, tokens in rows.values_list("key", "start", "tokens"):
        if (key, start) in wanted:
            used[wanted[key, start]] = tokens
    return used


def quota_resets(period: str, now: float) -> datetime:
    """When the quota `period` that `now` falls in ends (UTC)."""
    return datetime.fromtimestamp(period_bounds(period, now)[1], UTC)
