"""The state directory where workers wait for the next agent: private, locked to one agent, and a key that every
connection must prove it holds (no worker processes: a listening socket in the test stands in for one)."""

import os
import shutil
import socket
import stat
import tempfile
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from pathlib import Path

import pytest

from agent.workers import rendezvous
from agent.workers.messages import Describe
from agent.workers.rendezvous import StateDirError, WorkerDirectory


@pytest.fixture
def state_dir():
    # Short on purpose: a Unix socket path holds at most 107 bytes, and pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="mg-"))
    yield path / "state"
    shutil.rmtree(path, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_it_makes_a_private_directory_and_a_key_that_lasts(state_dir):
    first = WorkerDirectory(state_dir)
    first.open()
    key = first.authkey
    assert len(key) == 32 and (state_dir / "workers" / "authkey").read_bytes() == key
    assert mode(state_dir) == mode(state_dir / "workers") == 0o700 and mode(state_dir / "workers" / "authkey") == 0o600
    first.close()
    again = WorkerDirectory(state_dir)
    again.open()
    assert again.authkey == key  # the workers of the previous agent hold this one
    again.close()


def test_a_directory_others_can_read_is_made_private_and_a_loose_key_is_refused(state_dir):
    (state_dir / "workers").mkdir(parents=True)
    os.chmod(state_dir / "workers", 0o755)
    (state_dir / "workers" / "authkey").write_bytes(b"k" * 32)
    os.chmod(state_dir / "workers" / "authkey", 0o644)
    with pytest.raises(StateDirError, match="authkey must be a regular file of this agent's user, mode 0600"):
        WorkerDirectory(state_dir).open()
    assert mode(state_dir / "workers") == 0o700


def test_one_agent_at_a_time_holds_the_directory(state_dir):
    first = WorkerDirectory(state_dir)
    first.open()
    with pytest.raises(StateDirError, match=rf"another agent \(pid {os.getpid()}\) is using the state directory"):
        WorkerDirectory(state_dir).open()
    first.close()
    second = WorkerDirectory(state_dir)
    second.open()  # the lock went with the first
    second.close()


def test_a_state_directory_too_deep_for_socket_paths_puts_its_sockets_in_a_short_private_one(state_dir,
                                                                                             monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(state_dir.parent))
    deep = state_dir / ("d" * 100)
    directory = WorkerDirectory(deep)
    directory.open()
    path = directory.socket_path(12345678901234567890)
    assert len(str(path)) <= 107 and path.parent.parent == state_dir.parent / f"modelgrid-{os.getuid()}"
    assert mode(path.parent) == mode(path.parent.parent) == 0o700
    assert (deep / "workers" / "authkey").exists()  # the key stays in the state directory
    rendezvous.listen(str(path)).close()
    directory.close()
    assert [s.path for s in WorkerDirectory(deep).sockets()] == [path]  # the next agent looks in the same place


def test_it_lists_worker_sockets_by_replica_id(state_dir):
    directory = WorkerDirectory(state_dir)
    directory.open()
    for name in ("replica-12.sock", "replica-3.sock", "authkey.tmp", "replica-x.sock"):
        (state_dir / "workers" / name).touch()
    assert [(s.replica_id, s.path.name) for s in directory.sockets()] == [(3, "replica-3.sock"),
                                                                          (12, "replica-12.sock")]
    directory.close()


def test_only_a_connection_with_the_key_gets_through(state_dir):
    directory = WorkerDirectory(state_dir)
    directory.open()
    path = str(directory.socket_path(1))
    server = rendezvous.listen(path)
    assert mode(Path(path)) == 0o600
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(rendezvous.accept(server, directory.authkey, 10)))
    thread.start()
    try:
        with pytest.raises(AuthenticationError):
            Client(path, family="AF_UNIX", authkey=b"not the agent's key")
        # No key at all: a client that just sends a pickled message gets the challenge, then the door.
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(path)
        unauthenticated = Connection(raw.detach())
        unauthenticated.send(Describe())
        assert unauthenticated.recv_bytes().startswith(b"#CHALLENGE#")
        with pytest.raises((EOFError, ConnectionError)):
            while True:  # "#FAILURE#", then the connection closes; nothing is ever answered
                assert unauthenticated.recv_bytes() == b"#FAILURE#"
        unauthenticated.close()
        conn = rendezvous.connect(path, directory.authkey)
        thread.join(10)
        (theirs,) = accepted
        conn.send("hello")
        assert theirs.recv() == "hello"  # the first connection to hold the key, after two refused
        conn.close()
        theirs.close()
    finally:
        thread.join(10)
        server.close()
        directory.close()


def test_no_connection_within_the_timeout_is_none(state_dir):
    directory = WorkerDirectory(state_dir)
    directory.open()
    server = rendezvous.listen(str(directory.socket_path(2)))
    try:
        assert rendezvous.accept(server, directory.authkey, 0.2) is None
    finally:
        server.close()
        directory.close()
