"""PostgreSQL timestamps parsed in C. Django loads every `timestamptz` through a subclass of psycopg's pure-Python
loader (regular expressions per value) so that it can relabel the result with the connection's time zone. A
scheduler pass at 10,000 replicas reads about 41,000 of them: 335 ms that way against 88 ms through psycopg's C
loader (a throwaway timing on this project's 2-core machine; bench/pass_cost.py times the whole pass). The C
loader cannot be subclassed, so a thin Python loader calls it and relabels as Django's does."""

from __future__ import annotations

import functools
from datetime import tzinfo

from psycopg import adapters
from psycopg.adapt import Loader
from psycopg.pq import Format

TIMESTAMPTZ = adapters.types["timestamptz"].oid
# psycopg's own loader for the text format: the C one where psycopg's binary package is installed (as pinned here),
# else the Python one, which this then only wraps.
_PARSER = adapters.get_loader(TIMESTAMPTZ, Format.TEXT)


@functools.cache
def timestamptz_loader(timezone: tzinfo | None) -> type[Loader]:
    """A loader class for `timezone` (Django's connection.timezone) that yields what Django's own does: the parsed
    datetime relabelled with `timezone`, which Django reads back from the class as `timezone`."""

    class TimestamptzLoader(Loader):
        def __init__(self, oid, context=None):
            super().__init__(oid, context)
            self._parse = _PARSER(oid, context).load

        def load(self, data):
            parsed = self._parse(data)
            # The connection's zone is Django's (it sets it), so the relabel is mostly a no-op; skip its copy then.
            return parsed if parsed.tzinfo is timezone else parsed.replace(tzinfo=timezone)

    TimestamptzLoader.timezone = timezone  # what Django's create_cursor compares with its own
    return TimestamptzLoader


def install(sender, connection, **kwargs) -> None:
    """connection_created receiver: each new (or pooled, checked out) PostgreSQL connection loads timestamps in C."""
    if connection.vendor != "postgresql":
        return
    loader = timestamptz_loader(connection.timezone)
    if connection.connection.adapters.get_loader(TIMESTAMPTZ, Format.TEXT) is not loader:
        connection.connection.adapters.register_loader(TIMESTAMPTZ, loader)
