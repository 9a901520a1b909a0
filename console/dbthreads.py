"""Which thread a database call made from async code runs on."""

from __future__ import annotations

import functools

from channels.db import database_sync_to_async
from django.db import connection, connections


def own_thread(fn):
    """`fn` as a coroutine function that runs on a thread of its own on PostgreSQL, so it never queues behind a
    scheduler pass on Channels' one database thread. Only for calls that cannot deadlock with a pass: reads, and
    transactions that lock one kind of row, replica rows by primary key as a pass writes them (intake batches,
    console/fleet/intake.py). SQLite
    takes one writer at a time anyway (and an in-memory test database refuses concurrent connections), so there
    every call shares that thread."""
    if connection.vendor == "sqlite":
        return database_sync_to_async(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            # Back to the pool at once, from this thread and context: the executor's threads come and go with
            # their event loop, and a connection a finished thread still held would be lost to the pool.
            connections.close_all()

    return database_sync_to_async(call, thread_sensitive=False)
