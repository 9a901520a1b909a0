"""Exactly one scheduler leader among the console processes, and the epoch that fences a deposed one.

The lock: on PostgreSQL a session-level advisory lock (pg_try_advisory_lock) taken on a dedicated connection
that stays open while leading, so a process that dies, or whose connection drops, leads no more; on SQLite
(one machine) an OS file lock (flock) on a file in the data dir, released by the kernel when the process dies.

The epoch: each new leader increments the one row of deployments_schedulerleader and keeps the value. Every
reconcile pass first checks, inside its own transaction, that the stored epoch is still its own (on PostgreSQL
with SELECT ... FOR UPDATE, so a successor's increment waits for the pass or the pass sees it). A leader that
was cut off and replaced without noticing (a network partition, a paused VM) thus writes nothing: its pass is
refused and it steps down.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.db import connection, transaction

TABLE = "deployments_schedulerleader"
ROW_ID = 1
# pg_try_advisory_lock's key: any fixed 64-bit number; advisory locks are per database, so ModelGrid
# installations sharing one PostgreSQL server in different databases do not contend.
ADVISORY_KEY = 0x4D47_5343_4845_4431  # "MGSCHED1"
LOCK_FILE = "scheduler.lock"


class NotLeader(Exception):
    """This process no longer leads the scheduler: its pass must write nothing."""


@dataclass(frozen=True)
class LeaderInfo:
    """The scheduler leader as the database records it (the latest elected; it may have died since)."""

    holder: str  # host:pid
    epoch: int
    since: datetime


def identity() -> str:
    """How this process names itself as a leader: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def current_leader() -> LeaderInfo | None:
    """The latest elected leader (host:pid, epoch, since), or None before the first election."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT holder, epoch, since FROM {TABLE} WHERE id = %s", [ROW_ID])
        row = cursor.fetchone()
    if row is None or not row[1]:
        return None
    return LeaderInfo(holder=row[0], epoch=int(row[1]), since=datetime.fromtimestamp(float(row[2]), UTC))


class LeaderLock(Protocol):
    def acquire(self) -> bool: ...

    def held(self) -> bool: ...

    def release(self) -> None: ...


class AdvisoryLock:
    """A PostgreSQL session advisory lock on a connection of its own (not Django's, which is closed and reopened
    freely): held exactly as long as that session lives. A follower keeps its connection for the next try."""

    def __init__(self, key: int = ADVISORY_KEY) -> None:
        self.key = key
        self._conn = None
        self._holding = False

    def _connect(self):
        import psycopg

        params = connection.get_connection_params()
        # Keepalives and a TCP user timeout: a connection to a server that vanished (no FIN, a partition) fails
        # within ~10 s instead of TCP's ~15 minutes, so held() answers and the leader steps down.
        return psycopg.connect(**params, autocommit=True, connect_timeout=5, keepalives=1, keepalives_idle=5,
                               keepalives_interval=2, keepalives_count=3, tcp_user_timeout=10_000)

    def acquire(self) -> bool:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        try:
            self._holding = bool(self._conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key]).fetchone()[0])
        except Exception:
            self.release()  # a broken connection: the next try opens a new one
            raise
        return self._holding

    def held(self) -> bool:
        if not self._holding:
            return False
        try:
            self._conn.execute("SELECT 1")
        except Exception:  # the session is gone, and the lock with it
            self.release()
            return False
        return True

    def release(self) -> None:
        conn, holding = self._conn, self._holding
        self._conn, self._holding = None, False
        if conn is None:
            return
        if holding:
            # Unlock before closing: PostgreSQL frees a closed session's locks only once its backend has exited,
            # a moment after close() returns, and a follower trying in that moment would be refused.
            with contextlib.suppress(Exception):
                conn.execute("SELECT pg_advisory_unlock(%s)", [self.key])
        with contextlib.suppress(Exception):
            conn.close()  # the session ends; PostgreSQL releases any advisory lock still held


class FileLock:
    """An exclusive flock on a file: one machine's processes (SQLite) contend; the kernel releases it when the
    process dies. Locks belong to open files, so two FileLocks in one process contend too."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def default_lock() -> LeaderLock:
    """The advisory lock on PostgreSQL, else a file lock in the data dir."""
    if connection.vendor == "postgresql":
        return AdvisoryLock()
    return FileLock(Path(settings.DATA_DIR) / LOCK_FILE)


def _stored_epoch(*, for_update: bool) -> int | None:
    # SQLite has no FOR UPDATE and needs none: its transactions here are IMMEDIATE, so a pass holds the database's
    # write lock from its first statement and no successor can change the epoch under it.
    lock = " FOR UPDATE" if for_update and connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT epoch FROM {TABLE} WHERE id = %s{lock}", [ROW_ID])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _next_epoch(holder: str) -> int:
    """Record `holder` as the new leader under the next epoch and return it (called with the lock held)."""
    with transaction.atomic(), connection.cursor() as cursor:
        now = time.time()
        cursor.execute(f"UPDATE {TABLE} SET epoch = epoch + 1, holder = %s, since = %s WHERE id = %s",
                       [holder, now, ROW_ID])
        if cursor.rowcount == 0:
            # The row was deleted by hand: start past any count a deposed leader could still hold (milliseconds
            # since 1970), since a repeated epoch would let that leader through the fence.
            cursor.execute(f"INSERT INTO {TABLE} (id, epoch, holder, since) VALUES (%s, %s, %s, %s)",
                           [ROW_ID, int(now * 1000), holder, now])
        return _stored_epoch(for_update=False)


class Elector:
    """One process's part in the election. Call its methods from one thread: the one that runs the passes
    (Django's connection is per thread, and the fence must run inside the pass's transaction)."""

    def __init__(self, lock: LeaderLock | None = None, holder: str | None = None) -> None:
        self.lock = lock if lock is not None else default_lock()
        self.holder = holder or identity()
        self.epoch: int | None = None

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    def try_lead(self) -> bool:
        """Take the lock if it is free and become leader under a new epoch; True when leading."""
        if self.leading:
            return True
        if not self.lock.acquire():
            return False
        try:
            self.epoch = _next_epoch(self.holder)
        except BaseException:
            self.lock.release()
            raise
        return True

    def fence(self) -> None:
        """Raise NotLeader unless this process still leads: its lock is held and the stored epoch is its own.
        Meant to run first inside a pass's transaction (reconcile_once's `fence`)."""
        if self.epoch is None:
            raise NotLeader("this process is not the scheduler leader")
        if not self.lock.held():
            raise NotLeader(f"lost the scheduler lock (epoch {self.epoch})")
        stored = _stored_epoch(for_update=True)
        if stored != self.epoch:
            raise NotLeader(f"epoch {self.epoch} was superseded (the database holds epoch {stored})")

    def check(self) -> None:
        """fence() without holding the epoch's row: for work beside the passes (the chores) that must not wait
        behind a pass's transaction, and writes only rows of its own, where one round from a leader deposed a
        moment ago does no harm."""
        if self.epoch is None:
            raise NotLeader("this process is not the scheduler leader")
        if not self.lock.held():
            raise NotLeader(f"lost the scheduler lock (epoch {self.epoch})")
        stored = _stored_epoch(for_update=False)
        if stored != self.epoch:
            raise NotLeader(f"epoch {self.epoch} was superseded (the database holds epoch {stored})")

    def step_down(self) -> None:
        """Stop leading and free the lock (safe to call when not leading)."""
        self.epoch = None
        self.lock.release()
