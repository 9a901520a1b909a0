"""What signing in leaves behind, kept no longer than it is useful: a chore of the scheduler leader
(console/control/chores.py) deletes expired sessions, and django-axes' access logs, failure logs and attempts older than
MODELGRID_SIGN_IN_RETENTION_DAYS."""

from __future__ import annotations

from datetime import datetime, timedelta

from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings
from django.contrib.sessions.models import Session


def prune(now: datetime) -> int:
    """Delete expired sessions and sign-in records past the retention; returns how many rows went (sync, DB)."""
    kept_from = now - timedelta(days=settings.MODELGRID_SIGN_IN_RETENTION_DAYS)
    # An attempt counts toward a lockout until its cool-off has passed: a shorter retention must not lift one.
    attempts_from = min(kept_from, now - settings.AXES_COOLOFF_TIME)
    gone = Session.objects.filter(expire_date__lt=now).delete()[0]
    # Counted by the rows themselves: an attempt's deletion also takes its expiration row with it.
    gone += AccessAttempt.objects.filter(attempt_time__lt=attempts_from).delete()[1].get(AccessAttempt._meta.label, 0)
    for model in (AccessLog, AccessFailureLog):
        gone += model.objects.filter(attempt_time__lt=kept_from).delete()[0]
    return gone
