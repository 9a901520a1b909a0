"""Many rows written in one round trip."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from django.db import connection, transaction
from django.db.models import Field, JSONField, Model, QuerySet

# From this many rows an update on PostgreSQL goes by COPY into a temporary table and one UPDATE from it: a quarter
# of the client's work of an UPDATE executed per row (30 ms against 120 ms for 10,000 rows of six columns, psycopg
# 3 here), where a few rows cost less than creating the table.
COPY_UPDATE_ROWS = 200
_staging = itertools.count()  # names of those tables: two updates in one transaction each have their own


def _cursor():
    """A cursor for statements executed for many rows. On PostgreSQL one that binds parameters on the server:
    Django's cursor binds them in the client, quoting every value into the statement's text, which cost three
    times the database's own work for 10,000 rows (0.64 s against 0.19 s). Wrapped as Django wraps its own, so
    the statements run in the current transaction and show in connection.queries."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    with connection.wrap_database_errors:
        return connection._prepare_cursor(ServerBindingCursor(connection.connection))


_PLAIN = (type(None), int, str, bool, float)


class JsonText(str):
    """A JSON column's value serialized already: written as it is. (The scheduler pass stores the very text it
    hashed and pushes, instead of serializing each host's desired state again: console/control/desired.py.)"""


def _prep(field: Field, value):
    """A value as the database driver takes it. Plain numbers, strings and None pass as they are except into a
    JSON column: the field's own preparation costs 3-5 us a value, 0.8 s for the 8,000 new replica rows of a
    pass."""
    if type(value) in _PLAIN and not isinstance(field, JSONField):
        return value
    if type(value) is JsonText and isinstance(field, JSONField):
        return str(value)
    return field.get_db_prep_save(value, connection)


def update_by_pk(objs: Sequence[Model], fields: Sequence[str]) -> None:
    """Write `fields` of each of `objs` (one model) to its row: one `UPDATE ... WHERE pk = %s` executed for every
    row (psycopg pipelines them). Not QuerySet.bulk_update: it builds a CASE WHEN expression per field and row
    and resolves each through the ORM, 3.5 ms a row for the nine fields of a replica status on PostgreSQL (350 ms
    for an intake tick of 100 statuses, docs/benchmarks.md), where the database's own work is a fraction of that.
    Rows go in the order given: callers sort them by key, as every writer of these rows does."""
    if objs:
        _update_objects(type(objs[0]), fields, objs)


def _update_objects(model: type[Model], fields: Sequence[str], objs: Sequence, locked: bool = False) -> None:
    attnames = [model._meta.get_field(f).attname for f in fields]
    update_values(model, fields, [(o.pk, *(getattr(o, a) for a in attnames)) for o in objs], locked=locked)


def update_values(model: type[Model], fields: Sequence[str], rows: Sequence[tuple], locked: bool = False) -> None:
    """update_by_pk from plain values, each row (pk, *the fields' values): no model instance per row (building one
    fills every field's default, a third of the cost of writing 10,000 deployments' states). Many rows on
    PostgreSQL: by COPY (COPY_UPDATE_ROWS), the rows locked first in key order as one statement per row would
    (`locked`: the caller holds their locks already)."""
    if not rows:
        return
    meta = model._meta
    columns = [meta.get_field(f) for f in fields]
    prepared = [(*(_prep(c, v) for c, v in zip(columns, values, strict=True)), pk) for pk, *values in rows]
    if connection.vendor == "postgresql" and len(prepared) >= COPY_UPDATE_ROWS:
        _update_by_copy(model, [c.column for c in columns], prepared, locked)
        return
    q = connection.ops.quote_name
    assignments = ", ".join(f"{q(c.column)} = %s" for c in columns)
    with _cursor() as cursor:
        cursor.executemany(f"UPDATE {q(meta.db_table)} SET {assignments} WHERE {q(meta.pk.column)} = %s", prepared)


def _update_by_copy(model: type[Model], columns: Sequence[str], prepared: Sequence[tuple], locked: bool) -> None:
    """The rows (the columns' values, then the pk) copied into a temporary table shaped like the model's, dropped at
    commit, and the model's rows updated from it in one statement."""
    q = connection.ops.quote_name
    table, pk = q(model._meta.db_table), q(model._meta.pk.column)
    names = [q(c) for c in columns]
    # A row given twice: its last values win, as with one UPDATE per row (UPDATE ... FROM would take either).
    prepared = list({row[-1]: row for row in prepared}.values())
    with transaction.atomic(savepoint=False):  # the table lives until commit: one is needed even in autocommit
        if not locked:
            lock_rows(model, (row[-1] for row in prepared))
        with _cursor() as cursor:
            staging = _staged(cursor, table, ", ".join([*names, pk]), prepared)
            cursor.execute(f"UPDATE {table} AS t SET {', '.join(f'{n} = s.{n}' for n in names)} "
                           f"FROM {staging} AS s WHERE t.{pk} = s.{pk}")


def _staged(cursor, table: str, columns: str, rows: Sequence[tuple]) -> str:
    """`rows` (of the quoted `columns`) copied into a new temporary table shaped like `table`'s, dropped at commit
    (the caller is in a transaction); returns its quoted name."""
    staging = connection.ops.quote_name(f"mg_staging_{next(_staging)}")
    cursor.execute(f"CREATE TEMPORARY TABLE {staging} ON COMMIT DROP AS SELECT {columns} FROM {table} WITH NO DATA")
    with connection.wrap_database_errors, cursor.copy(f"COPY {staging} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
    return staging


def upsert_values(model: type[Model], fields: Sequence[str], rows: Sequence[tuple]) -> None:
    """Create or overwrite rows by primary key, each row (pk, *the fields' values), locking them in key order. Not
    QuerySet.bulk_create(update_conflicts=True): on PostgreSQL it sends each column as one array quoted element
    by element in the client, with a regular expression substitution per character to escape (2.5 s of the 3.6 s a
    pass spent storing 1,000 hosts' desired states, profiled). Here PostgreSQL takes the rows by COPY into a
    temporary table and one INSERT ... ON CONFLICT from it; elsewhere that INSERT is executed for each row."""
    if not rows:
        return
    meta = model._meta
    columns = [meta.get_field(f) for f in fields]
    q = connection.ops.quote_name
    table, pk = q(meta.db_table), q(meta.pk.column)
    names = [q(c.column) for c in columns]
    # A row given twice: its last values win (one INSERT ... ON CONFLICT may not touch a row twice).
    prepared = sorted({pk_: (pk_, *(_prep(c, v) for c, v in zip(columns, values, strict=True)))
                       for pk_, *values in rows}.values(), key=lambda row: row[0])
    overwrite = ", ".join(f"{n} = EXCLUDED.{n}" for n in names)
    every = ", ".join([pk, *names])
    with _cursor() as cursor:
        _insert_on_conflict(cursor, table, every, len(names) + 1, prepared,
                            f"ON CONFLICT ({pk}) DO UPDATE SET {overwrite}", order=pk)


def _insert_on_conflict(cursor, table: str, columns: str, width: int, rows: Sequence[tuple], conflict: str,
                        order: str = "") -> None:
    """INSERT `rows` (of the quoted `columns`, `width` of them) with the `conflict` clause: on PostgreSQL by COPY
    into a temporary table and one INSERT from it (in the `order` given), elsewhere executed for each row (where
    `conflict` may be empty: a plain INSERT)."""
    if connection.vendor != "postgresql":
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * width)}) {conflict}", rows)
        return
    with transaction.atomic(savepoint=False):  # the table lives until commit: one is needed even in autocommit
        staging = _staged(cursor, table, columns, rows)
        cursor.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {staging}"
                       f"{f' ORDER BY {order}' if order else ''} {conflict}")


def update_fields_by_pk(model: type[Model], changes: Iterable[tuple[object, Sequence[str]]]) -> None:
    """Write each object's own changed fields (rows of `model`, as instances or plain objects with `pk` and the
    fields' attributes): one statement per set of fields (a pass's rows mostly change the same few), so a thousand
    rows cost a few statements, not a thousand saves. The groups take their rows out of key order, so every row is
    locked first, in key order (lock_rows)."""
    groups: dict[tuple[str, ...], list] = {}
    for obj, fields in changes:
        groups.setdefault(tuple(sorted(fields)), []).append(obj)
    with transaction.atomic(savepoint=False):  # the locks held until the writes are done, even in autocommit
        lock_rows(model, (o.pk for objs in groups.values() for o in objs))
        for fields, objs in groups.items():
            _update_objects(model, fields, objs, locked=True)  # not locked a second time


def lock_rows(model: type[Model], pks: Iterable[int]) -> None:
    """Lock these rows in key order, as every writer of rows that others write too takes them, so that writes
    after may take them in any order without risking a deadlock. (SQLite: nothing to do, its one writer holds the
    whole database.)"""
    pks = sorted(set(pks))
    if not pks or connection.vendor != "postgresql":
        return
    q = connection.ops.quote_name
    pk = q(model._meta.pk.column)
    with _cursor() as cursor:
        cursor.execute(f"SELECT {pk} FROM {q(model._meta.db_table)} WHERE {pk} = ANY(%s) ORDER BY {pk} FOR UPDATE",
                       [pks])


def update_in_key_order(query: QuerySet, **values) -> int:
    """query.update(**values), its rows locked first in key order, as every writer of rows that others write too
    takes them; returns how many were updated. An UPDATE of many rows locks them in the order it finds them, which
    once rows have moved is not key order: intake's lease renewal (an UPDATE of a batch's hosts) deadlocked with a
    pass's generation bumps (key order) in most 1,000-host fleet runs, and PostgreSQL broke each deadlock after
    deadlock_timeout by failing the intake batch, whose messages were then applied a transaction each: its acks
    committed seconds late (docs/benchmarks.md)."""
    if connection.vendor != "postgresql":
        return query.update(**values)
    with transaction.atomic(savepoint=False):  # the locks held until the update, even in autocommit
        keys = list(query.order_by("pk").select_for_update(of=("self",)).values_list("pk", flat=True))
        return query.model._base_manager.filter(pk__in=keys).update(**values) if keys else 0


def insert(objs: Sequence[Model], skip_conflicts: bool = False) -> None:
    """Create the rows of `objs` (one model, new rows, primary keys left to the database). Not
    QuerySet.bulk_create: on PostgreSQL it sends the rows as one array per column, quoted element by element in the
    client (4.8 s for the 8,000 replicas, GPU links and events of one pass at 1,000 hosts, profiled). Their primary
    keys are not read back: callers that need them look them up."""
    if not objs:
        return
    meta = type(objs[0])._meta
    columns = [f for f in meta.concrete_fields if not f.primary_key]
    insert_values(type(objs[0]), [c.name for c in columns], [tuple(c.pre_save(o, True) for c in columns) for o in objs],
                  skip_conflicts)


def insert_values(model: type[Model], fields: Sequence[str], rows: Sequence[tuple], skip_conflicts: bool = False
                  ) -> None:
    """insert() from plain values, each row the `fields`' values in order: no model instance per row. PostgreSQL
    takes the rows by COPY, a tenth of the client's work of an INSERT executed for each (0.12 s against 1.1 s for
    95,000 rows of seven columns, psycopg 3 here); elsewhere an INSERT is executed for each row. `skip_conflicts`:
    a row that would break a unique constraint is left out (as bulk_create(ignore_conflicts=True), which quotes
    every value in the client); on PostgreSQL the rows then go by COPY into a temporary table and one INSERT ... ON
    CONFLICT DO NOTHING from it."""
    if not rows:
        return
    meta = model._meta
    columns = [meta.get_field(f) for f in fields]
    q = connection.ops.quote_name
    table, names = q(meta.db_table), ", ".join(q(c.column) for c in columns)
    prepared = [tuple(_prep(c, v) for c, v in zip(columns, row, strict=True)) for row in rows]
    with _cursor() as cursor:
        if skip_conflicts or connection.vendor != "postgresql":  # an INSERT for each row, or one from a COPY
            _insert_on_conflict(cursor, table, names, len(columns), prepared,
                                "ON CONFLICT DO NOTHING" if skip_conflicts else "")
            return
        # (Django logs the statement; its errors, a unique violation say, come as Django's through the wrapper.)
        with connection.wrap_database_errors, cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
            for row in prepared:
                copy.write_row(row)
