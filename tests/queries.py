"""The SQL statements Django logged, for tests that count or inspect a code path's statements."""

import re

_MANY = re.compile(r"^\d+ times: ")


def statements(captured) -> list[str]:
    """Each logged statement's SQL; a statement executed for many rows (executemany, logged as "N times: SQL")
    is one entry with that prefix removed."""
    return [_MANY.sub("", q["sql"]) for q in captured]
