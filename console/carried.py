"""Rows carried over from one read of a table to the next, re-read only where they changed."""

from __future__ import annotations

import weakref

from django.db import connection
from django.db.models import Expression, Model
from django.db.models.expressions import RawSQL

_every: weakref.WeakSet[CarriedRows] = weakref.WeakSet()


class CarriedRows:
    """A table's rows as plain tuples of `fields` in `order`, carried over from one read to the next. On PostgreSQL
    a read lists every row's version, its `xmin` (the transaction that wrote it) and `ctid` (where it lies: a
    new version of a row lies elsewhere, even within one transaction), and fetches only the rows whose version
    it has not carried; elsewhere it reads every row. Decoding the rows (JSON and timestamps through Django's
    converters) was a third of a pass that changed nothing at 10,000 replicas (bench/pass_cost.py), and between
    passes few rows change. What is handed out are the carried tuples themselves: callers build their own row
    objects from them, so changing those changes nothing here (the JSON values inside are shared: never changed in
    place, as a pass replaces a field's value instead)."""

    def __init__(self, model: type[Model], fields: tuple[str, ...], order: tuple[str, ...],
                 **expressions: Expression) -> None:
        """`fields` may name `expressions` (computed by the database, as for annotate)."""
        self.model, self.fields, self.order, self.expressions = model, fields, order, expressions
        self._carried: dict[int, tuple[str, tuple]] = {}  # pk -> (version, values)
        _every.add(self)

    def forget(self) -> None:
        self._carried = {}

    def read(self) -> list[tuple]:
        objects = self.model.objects.order_by(*self.order).annotate(**self.expressions)
        if connection.vendor != "postgresql":
            return list(objects.values_list(*self.fields))
        table = connection.ops.quote_name(self.model._meta.db_table)
        versioned = objects.annotate(_version=RawSQL(f"{table}.xmin::text || ' ' || {table}.ctid::text", ()))
        listed = list(versioned.values_list("pk", "_version"))
        carried = self._carried
        stale = [pk for pk, version in listed if carried.get(pk, ("",))[0] != version]
        fetched: dict[int, tuple[str, tuple]] = {}
        if stale:
            # A few rows by key; many (the first read, a rollout's) in one scan rather than a long IN list.
            query = versioned.filter(pk__in=stale) if len(stale) * 4 < len(listed) else versioned
            fetched = {pk: (version, tuple(values))
                       for pk, version, *values in query.values_list("pk", "_version", *self.fields)}
        kept: dict[int, tuple[str, tuple]] = {}  # swapped in whole: two threads' reads never mix
        for pk, version in listed:
            if pk in fetched:  # its newest version: it may have changed since the listing
                kept[pk] = fetched[pk]
            elif pk in carried and carried[pk][0] == version:
                kept[pk] = carried[pk]
            # else stale and not fetched: deleted since the listing
        self._carried = kept
        return [row[1] for row in kept.values()]


def forget_all() -> None:
    """Every carried read reads every row afresh next time (a process that has just begun to lead the scheduler)."""
    for rows in list(_every):
        rows.forget()
