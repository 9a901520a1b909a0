"""Writing usage buckets: adds, never overwrites (two writers of the same bucket add up, on SQLite and PostgreSQL,
concurrently on PostgreSQL), a deleted token's counts kept unnamed, minutes rolled into hours and old hours pruned."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.db.models import Sum

from console.accounts.models import ApiToken, Team
from console.usage.models import UsageHour, UsageMinute, UsageTotal
from console.usage.store import keep, write

pytestmark = pytest.mark.django_db
NOW = 1_800_000_000 - 1_800_000_000 % 3600  # on the hour


@pytest.fixture
def owner(db):
    user = get_user_model().objects.create_user("ann", password="unused-password-123")
    team = Team.objects.create(name="research")
    token = ApiToken.issue(user, "bot")[0]
    return team.pk, token.pk


def _totals(model=UsageMinute) -> dict:
    return model.objects.aggregate(requests=Sum("requests"), errors=Sum("errors"), prompt=Sum("prompt_tokens"),
                                   completion=Sum("completion_tokens"), queue=Sum("queue_seconds"))


def test_two_writers_of_the_same_bucket_add_up(owner):
    team, token = owner
    write({(NOW, team, token, "chat"): [2, 1, 10, 4, 0.5]})
    write({(NOW, team, token, "chat"): [3, 0, 5, 1, 0.25], (NOW + 60, team, token, "chat"): [1, 0, 1, 1, 0.0]})
    assert UsageMinute.objects.count() == 2
    assert UsageMinute.objects.filter(at=NOW).values_list("requests", "errors", "prompt_tokens",
                                                          "completion_tokens", "queue_seconds").get() == (5, 1, 15,
                                                                                                          5, 0.75)


def test_a_deleted_token_keeps_its_counts_unnamed(owner):
    team, token = owner
    ApiToken.objects.filter(pk=token).delete()
    write({(NOW, team, token, "chat"): [1, 0, 3, 2, 0.0]})
    write({(NOW, team, token, "chat"): [1, 0, 3, 2, 0.0], (NOW, team, 0, "chat"): [1, 1, 0, 0, 0.0]})
    row = UsageMinute.objects.get()
    assert row.token_id is None and (row.requests, row.errors, row.prompt_tokens) == (3, 1, 6)


def test_old_minutes_roll_into_hours_and_old_hours_go(owner, settings):
    team, token = owner
    settings.MODELGRID_USAGE_MINUTE_RETENTION_DAYS = 1
    settings.MODELGRID_USAGE_HOUR_RETENTION_DAYS = 10
    old = NOW - 2 * 86400
    write({(old, team, token, "chat"): [1, 0, 5, 1, 0.5], (old + 600, team, token, "chat"): [2, 1, 5, 1, 0.0],
           (old + 3600, team, token, "chat"): [1, 0, 1, 1, 0.0], (NOW, team, token, "chat"): [1, 0, 1, 1, 0.0]})
    UsageHour.objects.create(at=NOW - 30 * 86400, team_id=team, token_id=token, deployment="chat", requests=9,
                             prompt_tokens=9, completion_tokens=9)
    before = _totals()["requests"]
    keep(datetime.fromtimestamp(NOW + 60, UTC))
    assert list(UsageMinute.objects.values_list("at", flat=True)) == [NOW]
    assert list(UsageHour.objects.order_by("at").values_list("at", "requests", "errors", "prompt_tokens")) == [
        (old, 3, 1, 10), (old + 3600, 1, 0, 1)]
    assert _totals()["requests"] + _totals(UsageHour)["requests"] == before
    keep(datetime.fromtimestamp(NOW + 120, UTC))  # again: nothing moves twice
    assert _totals(UsageHour)["requests"] == 4
    assert _totals(UsageTotal)["requests"] == 5  # all that was written: pruning an hour takes nothing from it


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_of_the_same_buckets_add_up_on_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite takes one writer at a time")
    user = get_user_model().objects.create_user("ann", password="unused-password-123")
    team, token = Team.objects.create(name="research").pk, ApiToken.issue(user, "bot")[0].pk
    rows = {(NOW + 60 * i, team, token, "chat"): [1, 0, 2, 3, 0.0] for i in range(20)}

    def writer():
        try:
            for _ in range(10):
                write(dict(rows))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert UsageMinute.objects.count() == 20
    assert _totals()["requests"] == 4 * 10 * 20 and _totals()["completion"] == 3 * 4 * 10 * 20


def test_the_consoles_chores_roll_usage(owner, settings):
    from console.control.chores import run_chores

    team, token = owner
    settings.MODELGRID_USAGE_MINUTE_RETENTION_DAYS = 1
    write({(NOW - 5 * 86400, team, token, "chat"): [1, 0, 2, 3, 0.0]})
    run_chores(datetime.fromtimestamp(NOW, UTC))
    assert not UsageMinute.objects.exists() and UsageHour.objects.get().requests == 1
