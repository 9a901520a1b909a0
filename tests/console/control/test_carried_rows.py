"""console/carried.CarriedRows: a pass's rows carried over between reads, re-read only where a row's
version changed (PostgreSQL; elsewhere every read is whole). Each read must equal a fresh read of the table."""

from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.db.models.fields.json import KeyTransform
from django.test.utils import CaptureQueriesContext

from console.bulk import update_values
from console.carried import CarriedRows
from console.control.snapshot import DeploymentRow, ReplicaRow, deployment_rows
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment

pytestmark = pytest.mark.django_db

FIELDS = tuple(ReplicaRow.__dataclass_fields__)
ORDER = ("deployment_id", "index")


def fresh() -> list[tuple]:
    return list(Replica.objects.order_by(*ORDER).values_list(*FIELDS))


@pytest.fixture
def replicas(model):
    for name in ("a", "b", "c"):
        create_deployment(name, "tiny", replicas=2)
    Replica.objects.bulk_create([Replica(deployment=d, index=i) for d in Deployment.objects.all() for i in range(2)])
    return CarriedRows(Replica, FIELDS, ORDER)


def test_each_read_equals_a_fresh_read_through_updates_inserts_and_deletes(replicas):
    assert replicas.read() == fresh() and len(fresh()) == 6
    first = Replica.objects.order_by(*ORDER).first()
    Replica.objects.filter(pk=first.pk).update(reason="moved", reservation={"gpus": ["h/0"]})
    assert replicas.read() == fresh()
    row = Replica.objects.get(pk=first.pk)
    row.ready_since = datetime(2026, 11, 27, 16, 0, tzinfo=UTC)
    row.save()
    Replica.objects.filter(index=1, deployment__name="c").delete()
    Replica.objects.create(deployment=Deployment.objects.get(name="a"), index=2)
    assert replicas.read() == fresh()
    # Updated as a pass updates many rows (console.bulk: by COPY and one UPDATE on PostgreSQL).
    update_values(Replica, ("reason",), [(pk, f"bulk {pk}") for pk in Replica.objects.values_list("pk", flat=True)])
    assert replicas.read() == fresh()
    assert {r[FIELDS.index("reason")] for r in replicas.read()} == {f"bulk {pk}" for pk, *_ in fresh()}


def test_a_row_changed_again_by_the_transaction_that_wrote_it_is_read_again(replicas):
    # Both versions carry that transaction's xmin: only their place (ctid) tells them apart.
    with transaction.atomic():
        pk = Replica.objects.order_by(*ORDER).values_list("pk", flat=True).first()
        Replica.objects.filter(pk=pk).update(reason="first")
        assert replicas.read() == fresh()
        Replica.objects.filter(pk=pk).update(reason="second")
        assert replicas.read() == fresh()
        assert [r for r in replicas.read() if r[0] == pk][0][FIELDS.index("reason")] == "second"


def test_changing_what_a_read_handed_out_changes_nothing_carried(replicas):
    rows = [ReplicaRow(*row) for row in replicas.read()]
    rows[0].reason, rows[0].desired_state = "changed by a pass that then rolled back", "stopped"
    assert replicas.read() == fresh()


def test_on_postgresql_only_the_rows_that_changed_are_fetched(replicas):
    replicas.read()
    changed = Replica.objects.order_by(*ORDER).values_list("pk", flat=True)[3]
    Replica.objects.filter(pk=changed).update(reason="x")
    with CaptureQueriesContext(connection) as queries:
        rows = replicas.read()
    assert rows == fresh()
    if connection.vendor == "postgresql":  # the listing of versions, then the changed row by key
        assert len(queries) == 2
        assert f"IN ({changed})" in queries[1]["sql"]
        with CaptureQueriesContext(connection) as queries:
            replicas.read()
        assert len(queries) == 1  # nothing changed: the listing alone
    else:
        assert len(queries) == 1  # every row, every read


def test_forget_reads_every_row_again(replicas):
    replicas.read()
    replicas.forget()
    with CaptureQueriesContext(connection) as queries:
        rows = replicas.read()
    assert rows == fresh()
    assert len(queries) == (2 if connection.vendor == "postgresql" else 1)
    assert "IN (" not in queries[-1]["sql"]  # a scan, not a long list of keys


def test_the_pass_reads_deployments_in_name_order_as_before(model):
    for name in ("zeta", "alpha", "mid"):
        create_deployment(name, "tiny")
    assert [d.name for d in deployment_rows()] == ["alpha", "mid", "zeta"]
    Deployment.objects.filter(name="alpha").update(name="omega")
    assert [d.name for d in deployment_rows()] == ["mid", "omega", "zeta"]
    assert all(isinstance(d, DeploymentRow) for d in deployment_rows())


def test_fields_computed_by_the_database_are_carried_and_follow_their_row(model):
    for name in ("a", "b"):
        create_deployment(name, "tiny")
    total = KeyTransform("total_bytes", KeyTransform("cpu", "estimates"))
    rows = CarriedRows(Deployment, ("name", "total"), ("name",), total=total)
    expected = list(Deployment.objects.order_by("name").annotate(total=total).values_list("name", "total"))
    assert rows.read() == expected and all(isinstance(t, int) for _, t in expected)
    dep = Deployment.objects.get(name="b")
    dep.estimates = {**dep.estimates, "cpu": {**dep.estimates["cpu"], "total_bytes": 12345}}
    dep.save(update_fields=["estimates"])
    assert rows.read() == [expected[0], ("b", 12345)]
