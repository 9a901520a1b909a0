"""console/bulk.py's inserts and updates: on PostgreSQL (the db_stack pass) by COPY (an update of many rows by COPY
into a temporary table, then one UPDATE from it), elsewhere a statement per row."""

import json
from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from console.bulk import (
    COPY_UPDATE_ROWS,
    JsonText,
    insert,
    insert_values,
    update_fields_by_pk,
    update_values,
    upsert_values,
)
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.fleet.models import Host, HostDesired
from console.series.models import Series

pytestmark = pytest.mark.django_db


def test_rows_read_back_as_written_json_times_nulls_and_text_that_copy_would_escape(model):
    deployment = create_deployment("chat", "tiny")
    at = datetime(2026, 11, 27, 16, 0, 0, 123456, tzinfo=UTC)
    reason = 'tab\there, newline\nthere, a backslash \\N and "quotes"'
    insert([Replica(deployment=deployment, index=0, reservation={"device": "cpu", "factor": 1.5, "nested": [1, None]},
                    adapter_stats=[], reason=reason, created=at, ready_since=None, pid=None, measured_bytes=2**40),
            Replica(deployment=deployment, index=1, sleep_wake={"direction": "wake"}, created=at, ready_since=at)])
    first, second = Replica.objects.filter(deployment=deployment).order_by("index")
    assert first.reservation == {"device": "cpu", "factor": 1.5, "nested": [1, None]}
    assert (first.reason, first.created, first.ready_since, first.pid, first.measured_bytes) == (
        reason, at, None, None, 2**40)
    assert (second.sleep_wake, second.ready_since, second.reason) == ({"direction": "wake"}, at, "")


def test_a_row_that_breaks_a_constraint_raises_djangos_error_and_the_transaction_writes_none(db):
    row = ("deployment", 7, "p95_ms", None, 100, 100, 0, 0.0, 0.0)
    fields = ("kind", "object_id", "metric", "value", "since", "first", "acc_window", "acc_sum", "acc_seconds")
    insert_values(Series, fields, [row])
    with pytest.raises(IntegrityError), transaction.atomic():  # Django's, as callers catch it
        insert_values(Series, fields, [("deployment", 8, "p95_ms", 1.0, 100, 100, 0, 0.0, 0.0), row])
    assert list(Series.objects.values_list("object_id", flat=True)) == [7]


def _replicas(count: int) -> list[Replica]:
    deployment = create_deployment("chat", "tiny")
    insert([Replica(deployment=deployment, index=i, reason="placed") for i in range(count)])
    return list(Replica.objects.filter(deployment=deployment).order_by("index"))


def test_an_update_of_many_rows_writes_each_its_own_values_and_no_other_row(model):
    *replicas, untouched = _replicas(COPY_UPDATE_ROWS + 1)
    at = datetime(2026, 11, 27, 19, 0, 0, 654321, tzinfo=UTC)
    reason = 'tab\there, newline\nthere, a backslash \\N and "quotes"'
    rows = [(r.pk, f"{reason} {r.index}", {"device": "cuda:0", "index": r.index, "none": None},
             at if r.index % 2 else None, r.index or None) for r in replicas]
    with CaptureQueriesContext(connection) as statements:
        update_values(Replica, ("reason", "reservation", "ready_since", "pid"), rows)
    got = {r.pk: (r.reason, r.reservation, r.ready_since, r.pid) for r in Replica.objects.all()}
    assert [got[pk] for pk, *_ in rows] == [tuple(values) for _, *values in rows]
    assert got[untouched.pk] == ("placed", {}, None, None)
    by_copy = any(s["sql"].startswith("COPY") for s in statements.captured_queries)
    assert by_copy == (connection.vendor == "postgresql")  # elsewhere an UPDATE per row


def test_two_updates_of_many_rows_in_one_transaction_and_one_outside_any(model):
    replicas = _replicas(COPY_UPDATE_ROWS)
    with transaction.atomic():  # each stages its rows in a table of its own, dropped at commit
        update_values(Replica, ("reason",), [(r.pk, "first") for r in replicas])
        update_values(Replica, ("pid",), [(r.pk, 7) for r in replicas])
    update_values(Replica, ("action",), [(r.pk, "kept") for r in replicas])  # opens its own transaction
    assert set(Replica.objects.values_list("reason", "pid", "action")) == {("first", 7, "kept")}


def test_a_row_given_twice_takes_its_last_values_as_one_update_per_row_would(model):
    replicas = _replicas(COPY_UPDATE_ROWS)
    update_values(Replica, ("reason",), [(r.pk, "first") for r in replicas] + [(replicas[0].pk, "last")])
    assert Replica.objects.get(pk=replicas[0].pk).reason == "last"
    assert Replica.objects.filter(reason="first").count() == COPY_UPDATE_ROWS - 1


def test_an_update_of_many_rows_that_breaks_a_constraint_raises_djangos_error_and_writes_none(model):
    replicas = _replicas(COPY_UPDATE_ROWS)
    rows = [(r.pk, 0 if r.index else 1) for r in replicas]  # every replica index 0: two of one deployment
    with pytest.raises(IntegrityError), transaction.atomic():
        update_values(Replica, ("index",), rows)
    assert sorted(Replica.objects.values_list("index", flat=True)) == list(range(COPY_UPDATE_ROWS))


def test_changed_fields_of_many_rows_are_written_per_group_with_their_rows_locked_once(model):
    replicas = _replicas(2 * COPY_UPDATE_ROWS)
    for r in replicas:
        r.reason, r.pid = f"moved {r.index}", r.index
    half = len(replicas) // 2
    with CaptureQueriesContext(connection) as statements:
        update_fields_by_pk(Replica, [(r, ["reason"]) for r in replicas[:half]] +
                            [(r, ["reason", "pid"]) for r in replicas[half:]])
    got = dict(Replica.objects.values_list("index", "pid"))
    assert all(got[r.index] == (r.index if r.index >= half else None) for r in replicas)
    assert set(Replica.objects.values_list("reason", flat=True)) == {f"moved {r.index}" for r in replicas}
    locks = [s for s in statements.captured_queries if "FOR UPDATE" in s["sql"]]
    assert len(locks) == (connection.vendor == "postgresql")  # once, in key order, for both groups


def test_an_upsert_creates_the_missing_rows_overwrites_the_others_and_the_last_of_a_repeated_row_wins(db):
    hosts = Host.objects.bulk_create([Host(name=f"h{i}", endpoint="http://127.0.0.1:9") for i in range(4)])
    HostDesired.objects.create(host=hosts[0], replicas=[{"id": 1}])
    HostDesired.objects.create(host=hosts[3], replicas=[{"id": 3}])
    text = 'tab\there, a backslash \\N and "quotes"'
    with CaptureQueriesContext(connection) as statements:
        upsert_values(HostDesired, ("replicas",), [(hosts[2].pk, [{"id": 2, "reason": text}]),
                                                   (hosts[0].pk, [{"id": 10}]), (hosts[0].pk, [{"id": 11}])])
    assert dict(HostDesired.objects.values_list("host_id", "replicas")) == {
        hosts[0].pk: [{"id": 11}], hosts[2].pk: [{"id": 2, "reason": text}], hosts[3].pk: [{"id": 3}]}
    by_copy = any(s["sql"].startswith("COPY") for s in statements.captured_queries)
    assert by_copy == (connection.vendor == "postgresql")  # elsewhere an INSERT per row
    assert not any("UNNEST" in s["sql"] for s in statements.captured_queries)  # not bulk_create's arrays


def test_json_serialized_already_is_stored_as_the_value_it_spells_and_a_plain_string_stays_a_string(db):
    """The scheduler pass stores the JSON text it hashed and pushes (JsonText), not that text as a JSON string."""
    hosts = Host.objects.bulk_create([Host(name=f"h{i}", endpoint="http://127.0.0.1:9") for i in range(2)])
    text = json.dumps([{"id": 7, "reason": 'tab\there, a backslash \\N and "quotes"', "gpus": [0, 3]}])
    upsert_values(HostDesired, ("replicas",), [(hosts[0].pk, JsonText(text)), (hosts[1].pk, text)])
    stored = dict(HostDesired.objects.values_list("host_id", "replicas"))
    assert stored[hosts[0].pk] == json.loads(text)
    assert stored[hosts[1].pk] == text  # a str is a JSON string, as the field itself would store it


def test_rows_that_would_break_a_unique_constraint_can_be_left_out_and_the_rest_are_written(db):
    # As bulk_create(ignore_conflicts=True), without its arrays quoted in the client (a wave's thousand memory
    # samples: record_loads).
    fields = ("kind", "object_id", "metric", "value", "since", "first", "acc_window", "acc_sum", "acc_seconds")
    insert_values(Series, fields, [("deployment", 7, "p95_ms", 1.0, 100, 100, 0, 0.0, 0.0)])
    with CaptureQueriesContext(connection) as statements:
        insert_values(Series, fields, [("deployment", 8, "p95_ms", 2.0, 100, 100, 0, 0.0, 0.0),
                                       ("deployment", 7, "p95_ms", 3.0, 100, 100, 0, 0.0, 0.0)], skip_conflicts=True)
    assert dict(Series.objects.values_list("object_id", "value")) == {7: 1.0, 8: 2.0}  # the old row stands
    by_copy = any(s["sql"].startswith("COPY") for s in statements.captured_queries)
    assert by_copy == (connection.vendor == "postgresql")
    assert not any("UNNEST" in s["sql"] for s in statements.captured_queries)
