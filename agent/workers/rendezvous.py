"""Where workers and agents find each other across an agent restart (no torch): the agent's state directory.

    <state dir>/agent.lock              held (flock) by the one agent using the directory
    <state dir>/workers/                0700
    <state dir>/workers/authkey         0600: the agent's key, 32 random bytes, made once
    <state dir>/workers/replica-<id>.sock   one per replica worker, which listens on it

A Unix socket path holds at most 107 bytes. When the state directory is too deep for that, the sockets live in
$XDG_RUNTIME_DIR (else /tmp)/modelgrid-<uid>/<digest of the state directory's path>/ instead, also 0700 and
checked to be ours, found again by the next agent on the same state directory.

A replica worker outlives its agent: it listens on its socket and, once its agent is gone, waits there for the
next one (up to its orphan timeout). The next agent connects to every socket it finds, asks what each worker runs,
and adopts it. What crosses these connections is pickled (agent.workers.messages), and unpickling runs code, so
nothing is read from a connection before it proved, by multiprocessing's HMAC challenge in both directions, that
it holds the agent's key; the socket itself is local and its directory is the agent's user's alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import socket
import stat
import struct
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge
from pathlib import Path

from agent.workers.messages import Attach

log = logging.getLogger(__name__)

DEFAULT_ORPHAN_TIMEOUT = 60.0  # seconds a replica worker waits for a new agent before it exits
HANDSHAKE_TIMEOUT = 5.0  # the key challenge; a peer that does not answer within it is dropped
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes on Linux, the last one a NUL
_SOCKET_NAME = re.compile(r"replica-(\d+)\.sock")


class StateDirError(Exception):
    """The state directory cannot be used: another agent holds it, or it is not a private directory of ours."""


@dataclass(frozen=True)
class WorkerSocket:
    replica_id: int
    path: Path


class WorkerDirectory:
    """One agent's state directory: its lock, its key, and its workers' sockets."""

    def __init__(self, state_dir: str | os.PathLike, orphan_timeout: float = DEFAULT_ORPHAN_TIMEOUT) -> None:
        self.root = Path(state_dir).expanduser().absolute()
        self.workers = self.root / "workers"
        self.sockets_dir = _sockets_dir(self.workers)
        self.orphan_timeout = orphan_timeout
        self._authkey: bytes | None = None
        self._lock: int | None = None

    @property
    def authkey(self) -> bytes:
        if self._authkey is None:
            raise RuntimeError("open() the worker directory first")
        return self._authkey

    def open(self) -> None:
        """Take the directory for this agent: lock it, make it private, read (or make) the key.
        StateDirError when another agent holds it or it is not ours."""
        if self._lock is not None:
            return
        _private_dir(self.root)
        _private_dir(self.workers)
        if self.sockets_dir != self.workers:
            _private_dir(self.sockets_dir.parent)
            _private_dir(self.sockets_dir)
        fd = os.open(self.root / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirError(f"another agent (pid {holder}) is using the state directory {self.root}; stop it "
                                "first, or give this one its own --state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            self._authkey = _read_or_make_key(self.workers / "authkey")
        except BaseException:
            os.close(fd)
            raise
        self._lock = fd

    def close(self) -> None:
        """Let the next agent have the directory (the lock also goes with this process, even killed)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def socket_path(self, replica_id: int) -> Path:
        return self.sockets_dir / f"replica-{int(replica_id)}.sock"

    def attach_for(self, replica_id: int) -> Attach:
        """What a replica's worker needs to wait for the next agent."""
        return Attach(str(self.socket_path(replica_id)), self.authkey, self.orphan_timeout)

    def sockets(self) -> list[WorkerSocket]:
        """The worker sockets found now, by replica id (some may be stale: their worker is gone)."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.sockets_dir):
                match = _SOCKET_NAME.fullmatch(entry.name)
                if match is not None:
                    found.append(WorkerSocket(int(match.group(1)), Path(entry.path)))
        return sorted(found, key=lambda s: s.replica_id)


def _sockets_dir(workers: Path) -> Path:
    """Where the worker sockets go: beside the key, unless the longest socket path would not fit there."""
    longest = workers / f"replica-{'9' * 20}.sock"  # any replica id (the console's are 64-bit)
    if len(os.fsencode(longest)) <= MAX_SOCKET_PATH:
        return workers
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    digest = hashlib.sha256(os.fsencode(workers)).hexdigest()[:16]
    return base / f"modelgrid-{os.getuid()}" / digest


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirError(f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise StateDirError(f"{path} belongs to uid {info.st_uid}, not to this agent's user (uid {os.getuid()})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours: the worker key and sockets inside must be reachable by us alone


def _read_or_make_key(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise StateDirError(f"{path} must be a regular file of this agent's user, mode 0600") from None
        key = path.read_bytes()
        if len(key) < 16:
            raise StateDirError(f"{path} holds {len(key)} bytes; a worker key has 32 (delete it to make a new one, "
                                "which strands the workers running now)") from None
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


# --- the connections ------------------------------------------------------------------------------


def listen(path: str) -> socket.socket:
    """A worker's listening socket at `path` (a stale file of a worker gone before is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        os.chmod(path, 0o600)
        server.listen(4)
    except BaseException:
        server.close()
        raise
    return server


def accept(server: socket.socket, authkey: bytes, timeout: float | None) -> Connection | None:
    """The next connection that proves it holds `authkey`, within `timeout` seconds (None: no limit); None when
    none came in time. Connections that fail the challenge are closed and logged, and the wait goes on."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        server.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        try:
            peer, _ = server.accept()
        except TimeoutError:
            return None
        conn = _authenticated(peer, authkey, server=True)
        if conn is not None:
            return conn


def connect(path: str | os.PathLike, authkey: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> Connection:
    """The agent's connection to a worker's socket. ConnectionRefusedError or FileNotFoundError: no worker listens
    there any more; AuthenticationError: it does not take our key; TimeoutError: it did not answer (busy with
    another connection)."""
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        peer.settimeout(timeout)
        peer.connect(os.fspath(path))
    except BaseException:
        peer.close()
        raise
    conn = _authenticated(peer, authkey, server=False)
    if conn is None:
        raise TimeoutError(f"the worker at {path} did not answer the key challenge within {timeout:g} s")
    return conn


def _authenticated(peer: socket.socket, authkey: bytes, server: bool) -> Connection | None:
    peer.settimeout(None)  # blocking: a Connection reads its descriptor directly
    # A kernel receive timeout bounds the challenge, so a peer that connects and stays silent cannot hold the
    # worker's only listener (or an agent's start).
    _receive_timeout(peer, HANDSHAKE_TIMEOUT)
    conn = Connection(peer.detach())
    try:
        if server:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
    except AuthenticationError:
        conn.close()
        if server:
            log.warning("refused a connection that does not hold this agent's key")
            return None
        raise
    except (OSError, EOFError) as e:
        conn.close()
        if server:
            log.warning("dropped a connection that did not finish the key challenge: %s", e or type(e).__name__)
            return None
        if isinstance(e, BlockingIOError):  # the receive timeout
            return None
        raise
    with socket.socket(fileno=os.dup(conn.fileno())) as view:
        _receive_timeout(view, 0)
    return conn


def _receive_timeout(sock: socket.socket, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def shutdown(conn: Connection) -> None:
    """End a connection both ways, so the thread blocked reading it wakes with EOF (closing it under that thread
    would not be safe); the caller closes it once the thread is done."""
    with contextlib.suppress(OSError, ValueError), socket.socket(fileno=os.dup(conn.fileno())) as view:
        view.shutdown(socket.SHUT_RDWR)
