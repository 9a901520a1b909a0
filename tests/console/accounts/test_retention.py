"""One retention for what signing in leaves behind: expired sessions go, and django-axes' access logs, failure logs
and attempts go once older than MODELGRID_SIGN_IN_RETENTION_DAYS; an attempt still counting toward a lockout stays."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from console.accounts.retention import prune

pytestmark = pytest.mark.django_db


def session(expires_in: timedelta) -> str:
    store = SessionStore()
    store["k"] = "v"
    store.create()
    Session.objects.filter(session_key=store.session_key).update(expire_date=timezone.now() + expires_in)
    return store.session_key


def records(age: timedelta, who: str) -> None:
    when = timezone.now() - age
    fields = {"username": who, "ip_address": "10.0.0.1", "user_agent": who, "http_accept": "", "path_info": "/"}
    AccessLog.objects.create(**fields)
    AccessFailureLog.objects.create(**fields)
    AccessAttempt.objects.create(**fields, get_data="", post_data="", failures_since_start=1)
    for model in (AccessLog, AccessFailureLog, AccessAttempt):
        model.objects.filter(username=who).update(attempt_time=when)


def test_the_default_keeps_sign_in_records_thirty_days():
    assert settings.MODELGRID_SIGN_IN_RETENTION_DAYS == 30


def test_expired_sessions_and_records_past_the_retention_go(settings):
    settings.MODELGRID_SIGN_IN_RETENTION_DAYS = 7
    expired, live = session(-timedelta(minutes=1)), session(timedelta(days=1))
    records(timedelta(days=8), "old")
    records(timedelta(days=6), "recent")
    assert prune(timezone.now()) == 1 + 3
    assert list(Session.objects.values_list("session_key", flat=True)) == [live] and expired != live
    for model in (AccessLog, AccessFailureLog, AccessAttempt):
        assert list(model.objects.values_list("username", flat=True)) == ["recent"]


def test_an_attempt_that_still_counts_toward_a_lockout_outlives_a_shorter_retention(settings):
    settings.MODELGRID_SIGN_IN_RETENTION_DAYS = 0.001  # 86 s, well within the 15-minute cool-off
    records(timedelta(minutes=10), "counting")
    prune(timezone.now())
    assert AccessAttempt.objects.filter(username="counting").exists()
    assert not AccessLog.objects.exists() and not AccessFailureLog.objects.exists()
    prune(timezone.now() + settings.AXES_COOLOFF_TIME)
    assert not AccessAttempt.objects.exists()
