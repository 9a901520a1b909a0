"""Replica workers' output on disk (no torch): each replica's log file, its rotation, the cleanup of logs of
replicas long gone, and a bounded tail reader.

    <state dir>/logs/replica-<id>.log     what the replica's workers wrote to fds 1 and 2: Python logging, print,
                                          C and CUDA libraries, faulthandler; each worker of the replica appends
    <state dir>/logs/replica-<id>.log.1   the previous MAX_BYTES of it

A worker learns its log file with its replica (Load.log_path; a warm spare knows none until then) and points its
fds 1 and 2 at it, appending (`redirect_output`). Nothing goes through the agent: a pipe would break when a
worker outlives its agent, and the next agent on the same state directory finds the same files. An agent without
a state directory keeps its logs in a private temporary directory, removed when it stops its workers (they die
with it).

Rotation is the agent's, by copy and truncate. A worker's descriptors cannot follow a rename (a renamed file keeps
receiving its writes), and rotating in the worker would mean owning every write: a pipe and a thread in each
worker, which C code writing to stderr while holding the GIL could deadlock. Writers append (O_APPEND), so after
the truncate their next write lands at the start of the emptied file; what a worker writes between the read and
the truncate (microseconds) is lost, and between two checks (CHECK_INTERVAL) a log may grow past MAX_BYTES by
what its worker writes meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

log = logging.getLogger(__name__)

MAX_BYTES = 1 << 20  # a replica's current log; rotation keeps one more file of at most this much
CHECK_INTERVAL = 2.0  # seconds between the agent's size checks
KEEP_SECONDS = 7 * 24 * 3600  # the log of a replica no longer here is removed once untouched this long
KEEP_GONE = 100  # of those, only this many (the most recently written) are kept even while younger
# The protocol's bounds (agent.protocol's MAX_LOG_LINES and MAX_LOG_LINE; not imported: workers import this module)
MAX_LINES = 1000  # lines one tail may return
MAX_LINE = 1000  # characters of one line; longer is cut, ending in "…"
READ_BYTES = 256 * 1024  # bytes one tail reads at most, from the ends of the files: a reply stays inside 1 MiB

_NAME = re.compile(r"replica-(\d+)\.log(\.1)?")
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")  # terminal colours and cursor moves
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # what remains unprintable (tabs are kept)


class ReplicaLogs:
    """One agent's replica logs: under `root` (its state directory's `logs/`), or with `root` None in a private
    temporary directory made on first use and removed by `close()`."""

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int = MAX_BYTES) -> None:
        self._root = Path(root) if root is not None else None
        self._temporary = root is None
        self.max_bytes = max_bytes

    @property
    def root(self) -> Path:
        """The directory, made (0700) if it is not there yet."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="modelgrid-worker-logs-"))
        self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self._root

    def path(self, replica_id: int) -> Path:
        return self.root / _current(replica_id)

    def rotated(self, replica_id: int) -> Path:
        return self.root / _rotated(replica_id)

    def for_worker(self, replica_id: int) -> str | None:
        """The file a new worker of this replica writes to; None (its output stays the agent's) when the directory
        cannot be made: a replica never fails for its log."""
        try:
            return str(self.path(replica_id))
        except OSError as e:
            log.warning("replica %d: no log file (%s); its worker writes to the agent's output", replica_id, e)
            return None

    def close(self) -> None:
        """Remove a temporary directory with everything in it; a state directory's logs stay for the next agent."""
        if self._temporary and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    # --- upkeep -------------------------------------------------------------------------------------

    def upkeep(self, live: Collection[int], now: float | None = None) -> None:
        """Rotate every log past max_bytes; remove the logs of replicas not in `live` that are older than
        KEEP_SECONDS or beyond the KEEP_GONE most recently written."""
        root = self._root  # as it is now: never made again here, should close() remove it meanwhile
        if root is None or not root.is_dir():
            return
        now = time.time() if now is None else now
        written: dict[int, float] = {}  # replica id -> its files' latest write
        for entry in os.scandir(root):
            match = _NAME.fullmatch(entry.name)
            if match is None:
                continue
            replica_id = int(match.group(1))
            try:
                info = entry.stat()
            except FileNotFoundError:
                continue
            written[replica_id] = max(written.get(replica_id, 0.0), info.st_mtime)
            if match.group(2) is None and info.st_size > self.max_bytes:
                self._rotate(root, replica_id)
        gone = sorted((r for r in written if r not in live), key=lambda r: written[r], reverse=True)
        for rank, replica_id in enumerate(gone):
            if rank >= KEEP_GONE or now - written[replica_id] > KEEP_SECONDS:
                for name in (_current(replica_id), _rotated(replica_id)):
                    with contextlib.suppress(FileNotFoundError):
                        (root / name).unlink()

    def rotate(self, replica_id: int) -> None:
        """Keep the last max_bytes of the current log as the rotated file, and empty the current one."""
        self._rotate(self.root, replica_id)

    def _rotate(self, root: Path, replica_id: int) -> None:
        try:
            current = open(root / _current(replica_id), "r+b")  # noqa: SIM115 - closed below, after the truncate
        except FileNotFoundError:
            return
        with current:
            size = os.fstat(current.fileno()).st_size
            current.seek(max(0, size - self.max_bytes))
            kept = current.read(self.max_bytes)
            current.truncate(0)  # right after the read: the writes lost in between are as few as can be
        partial = root / f".{_rotated(replica_id)}.tmp"
        partial.write_bytes(kept)
        os.replace(partial, root / _rotated(replica_id))  # a reader sees the old rotated file or the new, whole

    # --- reading ------------------------------------------------------------------------------------

    def tail(self, replica_id: int, lines: int) -> list[str] | None:
        """The last `lines` lines (1 to MAX_LINES) of the replica's log, oldest first, the rotated file's end
        included when the current one holds fewer; None when there is no log of it here."""
        if self._root is None:
            return None
        return read_tail([self.path(replica_id), self.rotated(replica_id)], lines)


def _current(replica_id: int) -> str:
    return f"replica-{int(replica_id)}.log"


def _rotated(replica_id: int) -> str:
    return f"replica-{int(replica_id)}.log.1"


def read_tail(paths: list[Path], lines: int, budget: int = READ_BYTES) -> list[str] | None:
    """The last `lines` lines of the files `paths` (newest first) as if they were one, reading at most `budget`
    bytes from their ends; each line cut at MAX_LINE characters and made printable. None when no file exists."""
    lines = max(1, min(int(lines), MAX_LINES))
    chunks: list[bytes] = []
    whole = True  # whether the oldest chunk read starts at a line's start
    found = False
    for path in paths:
        if budget <= 0:
            break
        try:
            with open(path, "rb") as f:
                start = max(0, os.fstat(f.fileno()).st_size - budget)
                f.seek(start)
                data = f.read(budget)  # a file growing meanwhile gives no more than the budget
        except FileNotFoundError:
            continue
        found = True
        chunks.insert(0, data)
        budget -= len(data)
        whole = start == 0
        if not whole or sum(c.count(b"\n") for c in chunks) > lines:
            break
    if not found:
        return None
    raw = b"".join(chunks).split(b"\n")
    if not whole:
        raw = raw[1:]  # the end of a line whose start was not read
    if raw and raw[-1] == b"":
        raw.pop()  # the newline that ends the file
    return [printable(line) for line in raw[-lines:]]


def printable(raw: bytes) -> str:
    """One log line as a person reads it: UTF-8 (undecodable bytes replaced), a progress bar's last redraw only,
    no terminal escapes, other control characters replaced, at most MAX_LINE characters."""
    raw = raw.rstrip(b"\r").rpartition(b"\r")[2]
    text = raw[: 4 * MAX_LINE + 64].decode("utf-8", "replace")  # 4 bytes per character at most, and escapes
    text = _CONTROL.sub("\ufffd", _ESCAPE.sub("", text))
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


def redirect_output(path: str) -> None:
    """In a worker: point fds 1 and 2 (so sys.stdout, sys.stderr, logging and C code alike) at `path`, appending.
    OSError when the file cannot be opened; the output then stays where it was."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # what was written before goes where it was meant to
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    # A file is block-buffered: each line must reach it when written, for a worker may be killed the next moment.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.reconfigure(line_buffering=True)
