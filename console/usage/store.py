"""Writing usage: the gateway's flushes add to minute buckets, the periodic chores roll old minutes into hours and
prune old hours. Every write adds (`INSERT ... ON CONFLICT ... DO UPDATE SET n = n + excluded.n`, on SQLite and
PostgreSQL alike), so several console processes flushing the same bucket add up and never overwrite."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Sum
from django.db.models.functions import Mod

from console.accounts.models import ApiToken, Team
from console.usage.models import UsageCounts, UsageHour, UsageMinute, UsageTotal

COUNTS = ("requests", "errors", "prompt_tokens", "completion_tokens", "queue_seconds")
OWNER = ("team_id", "token_id", "deployment")
CHUNK = 500  # rows per statement: under SQLite's parameter limit
HOUR = 3600

# (bucket start, team id, token id, deployment) -> [requests, errors, prompt, completion, queue seconds]
Rows = dict[tuple[int, int | None, int | None, str], list]


def write(rows: Rows) -> None:
    """Add the gateway's tallies `rows` to their minute buckets and to the totals (sync, DB). A team or token that is
    gone (or 0: none) is written as null."""
    if not rows:
        return
    # A team or token deleted since the request keeps its counts, unnamed (foreign keys are checked at commit:
    # one deleted meanwhile fails this flush, and the next, which carries its counts, writes them).
    with transaction.atomic():
        known = _known(rows)
        _add(known, UsageMinute)
        totals: Rows = {}
        for (_, *owner), counts in known.items():
            _merge(totals.setdefault(tuple(owner), [0, 0, 0, 0, 0.0]), counts)
        _add(totals, UsageTotal)


def _add(rows: Rows, model: type[UsageCounts]) -> None:
    """Add to `model`'s rows, keyed by (at,) team, token and deployment: the owner last, as `rows` are keyed."""
    key = ("at", *OWNER) if model is not UsageTotal else OWNER
    keyed, loose = [], []
    # In key order, so two writers of the same buckets on PostgreSQL take their row locks in the same order.
    for owned, counts in sorted(rows.items(), key=lambda kv: tuple(v or 0 for v in kv[0])):
        *at, team, token, deployment = owned
        row = (*at, team or None, token or None, deployment, *counts)
        (keyed if team and token else loose).append(row)
    table = connection.ops.quote_name(model._meta.db_table)
    columns = ", ".join(key + COUNTS)
    added = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in COUNTS)
    with connection.cursor() as cursor:
        for i in range(0, len(keyed), CHUNK):
            part = keyed[i:i + CHUNK]
            values = ", ".join(["(" + ", ".join(["%s"] * len(part[0])) + ")"] * len(part))
            cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {values} "
                           f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {added}",
                           [v for row in part for v in row])
    for row in loose:  # a null in the key never conflicts: found and added to by hand (rare: a deleted owner)
        named = dict(zip(key, row, strict=False))
        counts = row[len(key):]
        found = model.objects.select_for_update().filter(**named).first()
        if found is None:
            model.objects.create(**named, **dict(zip(COUNTS, counts, strict=True)))
        else:
            model.objects.filter(pk=found.pk).update(**{c: F(c) + n for c, n in zip(COUNTS, counts, strict=True)})


def _known(rows: Rows) -> Rows:
    teams = set(Team.objects.filter(pk__in={k[1] for k in rows}).values_list("pk", flat=True))
    tokens = set(ApiToken.objects.filter(pk__in={k[2] for k in rows}).values_list("pk", flat=True))
    out: Rows = {}
    for (at, team, token, deployment), counts in rows.items():
        key = (at, team if team in teams else None, token if token in tokens else None, deployment)
        _merge(out.setdefault(key, [0, 0, 0, 0, 0.0]), counts)
    return out


def _merge(into: list, counts: list) -> None:
    for i, n in enumerate(counts):
        into[i] += n


def keep(now: datetime) -> None:
    """Roll minute buckets older than MODELGRID_USAGE_MINUTE_RETENTION_DAYS into hours, and drop hours older than
    MODELGRID_USAGE_HOUR_RETENTION_DAYS (sync, DB; one of the console's periodic chores)."""
    unix = int(now.timestamp())
    cutoff = unix - int(settings.MODELGRID_USAGE_MINUTE_RETENTION_DAYS * 86400)
    cutoff -= cutoff % HOUR  # whole hours only: an hour is rolled once, all of its minutes together
    with transaction.atomic():
        old = UsageMinute.objects.filter(at__lt=cutoff)
        hours = (old.order_by().annotate(hour=F("at") - Mod("at", HOUR))
                 .values_list("hour", "team_id", "token_id", "deployment")
                 .annotate(*(Sum(c) for c in COUNTS)))
        _add({(h, team, token, dep): list(counts) for h, team, token, dep, *counts in hours}, UsageHour)
        old.delete()
    UsageHour.objects.filter(at__lt=unix - int(settings.MODELGRID_USAGE_HOUR_RETENTION_DAYS * 86400)).delete()
