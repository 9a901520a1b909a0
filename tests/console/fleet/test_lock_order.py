"""Writers of many host rows lock them in key order, as a pass's generation bumps do: an UPDATE of many rows locks
them in the order it finds them, and once rows have moved that is not key order. Intake's lease renewal deadlocked
with a pass this way in most 1,000-host fleet runs (PostgreSQL failed the intake batch, and its acks, applied again
a transaction each, committed seconds late)."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from console.fleet.models import Host
from console.intake import stages as intake

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql",
                                 reason="row locks: SQLite has one writer for the whole database")]


def waiting_for_a_lock(timeout: float = 10.0) -> bool:
    """Whether another backend of this database waits for a lock (bounded poll)."""
    deadline = time.monotonic() + timeout
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock'")
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.02)
    return False


def run(fn, errors: list) -> threading.Thread:
    def body() -> None:
        try:
            fn()
        except Exception as e:  # a deadlock victim's error, say
            errors.append(e)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_a_lease_renewal_and_a_passs_bumps_take_the_same_hosts_without_deadlock():
    old = timezone.now() - timedelta(hours=1)
    first, second = (Host.objects.create(name=n, endpoint="http://127.0.0.1:9", connected=True, last_seen=old)
                     for n in ("a", "b"))
    for _ in range(3):  # the first row's live version now lies after the second's: a scan finds the second first
        Host.objects.filter(pk=first.pk).update(generation=F("generation") + 1)
    errors: list = []
    first_locked, bump_second = threading.Event(), threading.Event()

    def pass_bumps() -> None:  # as bump_generations: one host after another, in key order
        with transaction.atomic():
            Host.objects.filter(pk=first.pk).update(generation=F("generation") + 1)
            first_locked.set()
            bump_second.wait(10)
            Host.objects.filter(pk=second.pk).update(generation=F("generation") + 1)

    def renew_leases() -> None:
        first_locked.wait(10)
        with transaction.atomic():
            intake._apply_to_hosts(timezone.now(), {first.pk, second.pk}, {}, [])

    threads = [run(pass_bumps, errors), run(renew_leases, errors)]
    assert waiting_for_a_lock(), "the renewal never waited for the pass's lock"
    bump_second.set()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert all(h.last_seen > old and h.generation >= 1 for h in Host.objects.all())
