"""The scheduler leader's chores: each runs every round, and one that fails neither stops the others nor the
loop."""

import pytest
from django.utils import timezone

from console.control import chores
from console.events.models import Event
from console.events.record import Note, record

pytestmark = pytest.mark.django_db


def test_a_failing_chore_is_logged_and_the_others_still_run(monkeypatch, caplog):
    ran = []

    def broken(now):
        raise RuntimeError("disk full")

    monkeypatch.setattr(chores, "_chores", lambda: [("broken", broken), ("fine", ran.append)])
    chores.run_chores()
    assert len(ran) == 1
    assert "chore broken failed" in caplog.text and "disk full" in caplog.text


def test_the_real_chores_prune_the_timeline(settings):
    settings.MODELGRID_EVENTS_RETENTION_DAYS = 1
    record([Note("host/old", "Connected", "hello")], timezone.now() - timezone.timedelta(days=3))
    record([Note("host/new", "Connected", "hello")])
    chores.run_chores()
    assert list(Event.objects.values_list("object", flat=True)) == ["host/new"]


def test_the_real_chores_purge_expired_sessions_and_old_sign_in_records(settings):
    from axes.models import AccessLog
    from django.contrib.sessions.models import Session

    Session.objects.create(session_key="gone", session_data="", expire_date=timezone.now() - timezone.timedelta(1))
    AccessLog.objects.create(username="ann", user_agent="", http_accept="", path_info="/")
    AccessLog.objects.update(attempt_time=timezone.now() - timezone.timedelta(days=31))
    chores.run_chores()
    assert not Session.objects.exists() and not AccessLog.objects.exists()
