"""The scheduler leader's periodic chores besides passes: each a plain function of the time, run every
CHORE_SECONDS on the database thread. One failing never stops the others or the loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

log = logging.getLogger("modelgrid.scheduler")
CHORE_SECONDS = 10.0


def _chores() -> list[tuple[str, Callable[[datetime], object]]]:
    # Imported here: chores reach into several apps, and this module is imported by the loop at start-up.
    from console.accounts.retention import prune as prune_sign_ins
    from console.alerts.evaluate import evaluate
    from console.events.record import prune
    from console.series.sampler import sample
    from console.usage.store import keep as keep_usage

    # The alerts after the sample: the foreign-memory rule reads the points the sample just wrote.
    return [("series", sample), ("alerts", evaluate), ("events", prune), ("sign-ins", prune_sign_ins),
            ("usage", keep_usage)]


def run_chores(now: datetime | None = None) -> None:
    """Run every chore once (sync, DB)."""
    now = now or timezone.now()
    for name, chore in _chores():
        try:
            chore(now)
        except Exception:
            log.exception("chore %s failed; it runs again in %g s", name, CHORE_SECONDS)
