"""Which thread a database call made from async code runs on."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.db import connection


def own_thread(fn):
    """`fn` as a coroutine function that runs on a thread of its own on PostgreSQL, so it never queues behind a
    scheduler pass or an intake batch on Channels' one database thread. Only for calls that cannot deadlock with
    those (reads, and writes that lock one kind of row): a pass and a batch lock replicas and hosts in opposite
    orders, which is why they share that thread. SQLite takes one writer at a time anyway (and an in-memory test
    database refuses concurrent connections), so there every call shares that thread."""
    return database_sync_to_async(fn, thread_sensitive=connection.vendor == "sqlite")
