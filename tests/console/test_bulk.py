"""console/bulk.py's inserts: on PostgreSQL (the db_stack pass) by COPY, elsewhere an INSERT per row."""

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, transaction

from console.bulk import insert, insert_values
from console.deployments.models import Replica
from console.deployments.services import create_deployment
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
