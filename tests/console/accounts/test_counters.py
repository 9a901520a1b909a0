"""The limit counters' sync (console/accounts/counters.py): many pending windows, more than one statement's
parameters allow (SQLite: 32,766 by default; PostgreSQL: 65,535), are all added, in chunks, keys in order; each
console's reservations in flight replace what it held, and count for the others while it keeps syncing."""

import sqlite3

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.accounts import counters
from console.accounts.models import LimitCounter, LimitHold

pytestmark = pytest.mark.django_db
NOW = 1_800_000_000


@pytest.fixture
def sqlite_default_limit():
    """SQLite as commonly built (some builds allow 250,000 parameters)."""
    if connection.vendor != "sqlite":
        yield
        return
    connection.ensure_connection()
    was = connection.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32766)
    yield
    connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, was)


def test_more_windows_than_one_statement_holds_are_all_added(sqlite_default_limit):
    windows = 14000  # 5 parameters each: 70,000 > 65,535 > 32,766
    deltas = {(f"token:{i:05d}", NOW - NOW % 60): (1, i, NOW + 60) for i in range(windows)}
    with CaptureQueriesContext(connection) as queries:
        counters.add(deltas)
    totals = counters.read(NOW)
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == -(-windows // counters.CHUNK)
    assert len(totals) == windows and totals["token:13999", NOW - NOW % 60] == (1, 13999)
    counters.add(deltas)
    again = counters.read(NOW)
    assert again["token:00042", NOW - NOW % 60] == (2, 84) and LimitCounter.objects.count() == windows


def test_chunks_go_in_key_order():
    deltas = {(f"team:{i}", NOW - NOW % 60): (1, 1, NOW + 60) for i in reversed(range(2 * counters.CHUNK + 1))}
    with CaptureQueriesContext(connection) as queries:
        counters.add(deltas)
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 3
    keys = [k for q in inserts for k in q["sql"].split("VALUES", 1)[1].split("'")[1::2] if k.startswith("team:")]
    assert keys == sorted(f"team:{i}" for i in range(2 * counters.CHUNK + 1))


def test_a_consoles_reservations_replace_what_it_held_and_count_for_the_others_only():
    window, other = ("team:1", NOW - NOW % 60), ("quota:1:day", NOW - NOW % 86400)
    counters.hold("a", {window: (100, NOW + 60), other: (100, NOW + 86400)}, NOW)
    counters.hold("b", {window: (30, NOW + 60)}, NOW)
    assert counters.held_by_others("c", NOW - 10, NOW) == {window: 130, other: 100}
    assert counters.held_by_others("a", NOW - 10, NOW) == {window: 30}  # its own it knows exactly
    counters.hold("a", {window: (40, NOW + 60)}, NOW + 1)  # set, not added; a window it no longer holds goes
    assert counters.held_by_others("c", NOW - 10, NOW + 1) == {window: 70}
    assert LimitHold.objects.filter(console="a").count() == 1


def test_a_console_that_stopped_syncing_holds_nothing_and_its_rows_are_pruned():
    window = ("team:1", NOW - NOW % 60)
    counters.hold("gone", {window: (500, NOW + 60)}, NOW - 11)
    counters.hold("live", {window: (5, NOW + 60)}, NOW)
    assert counters.held_by_others("me", NOW - 10, NOW) == {window: 5}
    counters.prune(NOW - 11 + counters.KEEP_S + 1)
    assert list(LimitHold.objects.values_list("console", flat=True)) == ["live"]


def test_reservations_in_windows_that_ended_count_for_nothing():
    counters.hold("a", {("team:1", NOW - 120): (100, NOW - 60)}, NOW)
    assert counters.held_by_others("b", NOW - 10, NOW) == {}
