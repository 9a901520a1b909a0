"""Row locks on deployments, taken before any row that points at one (replicas, adapters): the order every writer
of both follows. Foreign keys are checked at commit, so a replica or adapter written for a deployment deleted
meanwhile fails a commit, the writer's or the delete's. Under these locks a delete sees the others whole or not
at all: who locks after a delete finds the row gone and writes nothing for it; a delete that locks after them
finds, and deletes, every row they wrote. (SQLite has one writer at a time: there only the check remains.)"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from django.db import connection
from django.db.models import QuerySet

from console.deployments.models import Deployment

Lock = Literal["delete", "change"]


def locked(rows: QuerySet, lock: Lock) -> QuerySet:
    """`rows` (of deployments) read under a row lock: "delete" takes it from every other writer; "change" lets
    readers that hold rows pointing at it (a pass's FOR KEY SHARE) go on. Only the deployment's own row is locked."""
    return rows.select_for_update(of=("self",), no_key=lock == "change")


def hold_existing(pks: Iterable[int]) -> set[int]:
    """Of these deployments, those that still exist, held until the transaction ends so none can be deleted
    meanwhile (FOR KEY SHARE: changes to their rows go on). A writer of their replica rows writes only for these."""
    pks = sorted(set(pks))
    if not pks:
        return set()
    if connection.vendor != "postgresql":
        return set(Deployment.objects.filter(pk__in=pks).values_list("pk", flat=True))
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {q('id')} FROM {q(Deployment._meta.db_table)} WHERE {q('id')} = ANY(%s) "
                       f"ORDER BY {q('id')} FOR KEY SHARE", [pks])
        return {pk for (pk,) in cursor.fetchall()}
