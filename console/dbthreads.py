"""Which thread a database call made from async code runs on."""

from __future__ import annotations

import functools
from concurrent.futures import Executor, ThreadPoolExecutor

from channels.db import database_sync_to_async
from django.db import connection, connections


def own_thread(fn, executor: Executor | None = None):
    """`fn` as a coroutine function that runs on a thread of its own on PostgreSQL, so it never queues behind a
    scheduler pass on Channels' one database thread: one of `executor`'s, else one of the event loop's default
    threads (shared by every other such call: see dedicated_thread). Only for calls that cannot deadlock with a
    pass: reads, and transactions that lock one kind of row, replica rows by primary key as a pass writes them
    (intake batches, console/intake/stages.py). SQLite takes one writer at a time anyway (and an in-memory test
    database refuses concurrent connections), so there every call shares that thread."""
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

    return database_sync_to_async(call, thread_sensitive=False, executor=executor)


def dedicated_thread(name: str) -> ThreadPoolExecutor:
    """A thread for one sequence of calls that must not wait for a free default thread. During a 1,000-host wave,
    intake's batches waited 0.5-1 s to start on the default threads (shared with the chores, the gateway's fleet
    snapshot and the links' reads) though each took 20-100 ms once started; on a thread of their own they start
    within 0-20 ms. The thread starts with the first call and lives as long as the process."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


def apart(fn, executor: Executor):
    """`fn` as a coroutine function on `executor`'s thread, on SQLite too, for work that must never queue on
    Channels' one database thread (browsers' pages: console/realtime/browsers.py). A SQLite file in WAL mode reads
    beside its one writer; only an in-memory database (the tests') takes no second connection, and there the call
    shares Channels' thread after all."""
    if connection.vendor != "sqlite":
        return own_thread(fn, executor)
    if connection.is_in_memory_db():
        return database_sync_to_async(fn)
    return database_sync_to_async(fn, thread_sensitive=False, executor=executor)
