"""The timeline's writing: events appended with their object, repeats folded into one row with a count, and
the table kept within its retention and row cap."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.events.models import Event
from console.events.record import Note, prune, record

pytestmark = pytest.mark.django_db


def test_it_appends_an_event_with_what_happened_to_which_object():
    assert record([Note("replica/chat#0", "Placed", "placed on h1/0", actor="scheduler", deployment="chat",
                        host="h1")]) == 1
    e = Event.objects.get()
    assert (e.object, e.type, e.reason, e.message, e.actor, e.count) == (
        "replica/chat#0", "Normal", "Placed", "placed on h1/0", "scheduler", 1)
    assert (e.deployment, e.host) == ("chat", "h1") and e.first_seen == e.last_seen


def test_a_repeat_within_the_fold_window_counts_on_the_same_row(settings):
    settings.MODELGRID_EVENTS_FOLD_SECONDS = 600
    t0 = timezone.now()
    failed = Note("replica/chat#0", "Failed", "CUDA out of memory", warning=True, actor="agent h1")
    record([failed], t0)
    record([Note("replica/chat#0", "Restarted", "restarted")], t0 + timedelta(seconds=1))
    assert record([failed, failed], t0 + timedelta(seconds=2)) == 0
    row = Event.objects.get(reason="Failed")
    assert row.count == 3 and row.type == "Warning"
    assert (row.first_seen, row.last_seen) == (t0, t0 + timedelta(seconds=2))


def test_a_repeat_after_the_window_or_with_other_words_is_a_new_event(settings):
    settings.MODELGRID_EVENTS_FOLD_SECONDS = 60
    t0 = timezone.now()
    record([Note("host/h1", "Disconnected", "link closed")], t0)
    record([Note("host/h1", "Disconnected", "link closed")], t0 + timedelta(seconds=61))
    record([Note("host/h1", "Disconnected", "link closed again")], t0 + timedelta(seconds=62))
    record([Note("host/h1", "Disconnected", "link closed again", actor="someone else")], t0 + timedelta(seconds=63))
    assert Event.objects.count() == 4 and set(Event.objects.values_list("count", flat=True)) == {1}


def test_pruning_drops_what_is_past_the_retention_then_the_oldest_past_the_cap(settings):
    settings.MODELGRID_EVENTS_RETENTION_DAYS = 1
    settings.MODELGRID_EVENTS_MAX_ROWS = 3
    now = timezone.now()
    record([Note("host/old", "Connected", "long ago")], now - timedelta(days=2))
    for i in range(5):
        record([Note(f"host/h{i}", "Connected", "hello")], now - timedelta(minutes=5 - i))
    assert prune(now) == 3
    assert sorted(Event.objects.values_list("object", flat=True)) == ["host/h2", "host/h3", "host/h4"]


def test_what_a_person_did_is_told_each_time_and_never_folded():
    change = Note("deployment/chat", "PolicyChanged", "priority standard → critical", actor="user ann", folds=False)
    record([change])
    record([change, change])
    assert list(Event.objects.values_list("count", flat=True)) == [1, 1, 1]
