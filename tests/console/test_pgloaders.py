"""console/pgloaders.py: timestamps parsed by psycopg's C loader, yielding exactly what Django's own loader does."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from psycopg import adapters
from psycopg.adapt import AdaptersMap
from psycopg.pq import Format

from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from console.pgloaders import _PARSER, TIMESTAMPTZ, timestamptz_loader

TEXTS = [b"2026-11-27 16:00:00+00", b"2026-11-27 16:00:00.123456+00", b"1969-12-31 23:59:59.999999+00",
         b"0001-01-01 00:00:00+00", b"9999-12-31 23:59:59.5+00", b"2026-03-29 01:30:00+02",
         b"2026-11-27 16:00:00-05:30"]


def djangos(tz):
    """Django's loader class for `tz`, as its backend registers it."""
    context = AdaptersMap(adapters)
    holder = type("Holder", (), {"adapters": context})()
    register_tzloader(tz, holder)
    return context.get_loader(TIMESTAMPTZ, Format.TEXT)


@pytest.mark.parametrize("tz", [UTC, timezone(timedelta(hours=2)), None])
def test_every_text_loads_as_djangos_loader_loads_it(tz):
    ours, theirs = timestamptz_loader(tz)(TIMESTAMPTZ), djangos(tz)(TIMESTAMPTZ)
    for text in TEXTS:
        mine, expected = ours.load(text), theirs.load(text)
        assert (mine, mine.tzinfo) == (expected, expected.tzinfo), text


def test_the_parser_is_psycopgs_c_one_and_django_reads_the_zone_off_the_class():
    assert _PARSER.__module__ == "psycopg_binary._psycopg"  # else this module would only add a call
    assert timestamptz_loader(UTC).timezone is UTC
    assert timestamptz_loader(UTC) is timestamptz_loader(UTC)  # one class per zone: registered once per connection


@pytest.mark.django_db
def test_a_connection_reads_timestamps_through_it_and_they_round_trip(model):
    at = datetime(2026, 11, 27, 16, 0, 0, 123456, tzinfo=UTC)
    create_deployment("chat", "tiny")
    Deployment.objects.filter(name="chat").update(last_request_at=at)
    assert Deployment.objects.values_list("last_request_at", flat=True).get(name="chat") == at
    if connection.vendor == "postgresql":  # SQLite keeps its own converters
        loader = connection.connection.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)
        assert loader is timestamptz_loader(connection.timezone)
