"""The worker's end of its connection to the agent: a reader thread answers heartbeats at once, queues the rest,
and, for a replica worker, waits for the next agent when its own goes away (no torch).

The worker's main thread spends seconds in loads, copies and forward passes without reading its connection.
Pings (and an adopting agent's Describe) are answered from the reader thread, so a worker is judged alive while
it works and dead only when the whole process stops (frozen, stuck holding the GIL, or gone). What crosses the
connection is agent.workers.messages.

Once attached (`attach()`), the worker listens on its socket in the agent's state directory
(agent.workers.rendezvous). When its connection closes, it queues DETACHED and waits there up to its orphan
timeout for an agent that proves it holds the key and asks Describe; that agent's connection replaces the old
one. Answers to the old agent's requests are dropped: request ids only grow over a worker's life (the
Description tells the new agent where to go on from), so an old answer cannot be taken for a new one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from agent.workers import rendezvous
from agent.workers.messages import (
    WORKER_PROTOCOL,
    AgentMessage,
    Attach,
    Command,
    Describe,
    Description,
    Failed,
    Generate,
    Loading,
    Ping,
    Pong,
    Progress,
    Ready,
    Refusal,
    Reply,
    Tokens,
    WorkerMessage,
)
from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.worker")


class Detached:
    """The agent's connection closed; the worker serves on for the next agent (not a wire message)."""


DETACHED = Detached()


class WorkerChannel:
    """Thread-safe sends; `recv()` gives the next non-ping message, or None once no agent will come any more."""

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn
        self._send_lock = threading.Lock()  # the reader thread sends pongs while the main thread sends results
        self._inbox: queue.Queue[AgentMessage | Detached | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="modelgrid-worker-pipe", daemon=True)
        self._attach: Attach | None = None
        self._server: socket.socket | None = None
        self._socket_inode: int | None = None
        self._gone = False  # no agent will come any more: sends fail from now on
        self._first_id = 1  # answers to requests below this belong to an agent that went away
        self._next_id = 1  # above every request id seen so far
        # What Describe answers; updated as lifecycle messages go out and sleeps and wakes finish.
        self._spec: WorkerSpec | None = None
        self._state = "starting"
        self._figures: dict[str, Any] = {}

    def start(self) -> None:
        self._reader.start()

    # --- outliving the agent --------------------------------------------------------------------

    def attach(self, spec: WorkerSpec, attach: Attach) -> None:
        """Listen on the replica's socket so that the next agent can adopt this worker (OSError if it cannot)."""
        server = rendezvous.listen(attach.socket_path)
        with self._send_lock:
            self._spec, self._attach, self._server = spec, attach, server
            self._socket_inode = os.stat(attach.socket_path).st_ino
        log.info("listening for the next agent on %s (orphan timeout %g s)", attach.socket_path, attach.orphan_timeout)

    def settled(self, kind: str, reply: Reply | Refusal) -> None:
        """A command finished: a sleep or a wake moved the weights, which the next agent must hear of."""
        if kind not in ("sleep", "wake") or not isinstance(reply, Reply):
            return
        with self._send_lock:
            self._state = "sleeping" if kind == "sleep" else "ready"
            self._figures["host_bytes"] = int(reply.value.get("host_bytes", 0))
            self._figures["sleep_wake"] = {k: reply.value[k] for k in ("direction", "bytes", "seconds", "bandwidth")
                                           if k in reply.value}

    # --- the main thread's side -----------------------------------------------------------------

    def recv(self) -> AgentMessage | None:
        """Block until the next command from an agent; None when no agent will come any more."""
        while True:
            message = self._inbox.get()
            if not isinstance(message, Detached):
                return message

    def take(self, wait: bool) -> list[AgentMessage | Detached | None]:
        """Every message waiting now (None: no agent will come any more; DETACHED: this one went away); with
        `wait`, block until there is one."""
        messages = [self._inbox.get()] if wait else []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def send(self, message: WorkerMessage) -> bool:
        """Send one message; False when no agent will come any more. Between two agents it is dropped (True)."""
        with self._send_lock:
            self._note(message)
            if isinstance(message, Reply | Refusal) and message.request_id < self._first_id:
                return True  # its agent went away
            if isinstance(message, Tokens) and any(t.request_id < self._first_id for t in message.tokens):
                message = Tokens([t for t in message.tokens if t.request_id >= self._first_id], message.stats)
            if self._conn is None:
                return not self._gone
            try:
                self._conn.send(message)
                return True
            except (BrokenPipeError, EOFError, OSError):
                return self._attach is not None  # the reader thread sees the same end and waits for the next agent

    def close(self) -> None:
        """The worker is ending: no more agents, and its socket is removed (if it is still its own)."""
        with self._send_lock:
            self._gone = True
            conn, self._conn = self._conn, None
            server, self._server = self._server, None
        if conn is not None:
            conn.close()
        if server is not None:
            server.close()
            path = self._attach.socket_path
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == self._socket_inode:  # not a socket a newer worker bound since
                    os.unlink(path)

    def _note(self, message: WorkerMessage) -> None:
        if isinstance(message, Loading):
            self._state = "loading"
            self._figures.update(loaded_bytes=0, total_bytes=message.total_bytes or None)
        elif isinstance(message, Progress):
            self._figures.update(loaded_bytes=message.loaded_bytes, total_bytes=message.total_bytes)
        elif isinstance(message, Ready):
            self._state = "ready"
            self._figures.update(measurement=dict(message.measurement), info=dict(message.info))
            self._figures["loaded_bytes"] = self._figures.get("total_bytes")
        elif isinstance(message, Failed):
            self._state = "failed"

    def _description(self) -> Description:
        assert self._spec is not None  # only attached workers are asked
        return Description(protocol=WORKER_PROTOCOL, spec=self._spec, pid=os.getpid(), state=self._state,
                           next_request_id=self._next_id, **self._figures)

    # --- the reader thread ----------------------------------------------------------------------

    def _read(self) -> None:
        conn = self._conn
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                conn = self._next_agent(conn)
                if conn is None:
                    self._inbox.put(None)
                    return
                continue
            if isinstance(message, Ping):
                self.send(Pong(message.number))
                continue
            if isinstance(message, Describe):
                with self._send_lock, contextlib.suppress(OSError):
                    conn.send(self._description())
                continue
            if isinstance(message, Command | Generate):
                with self._send_lock:
                    self._next_id = max(self._next_id, message.request_id + 1)
            self._inbox.put(message)

    def _next_agent(self, old: Connection) -> Connection | None:
        """After the agent's connection closed: the next agent's, or None (not attached, closing, or nobody came
        within the orphan timeout)."""
        with self._send_lock:
            if self._conn is old:
                self._conn = None
            attach, server = self._attach, self._server
            if attach is None or server is None:
                self._gone = True
        with contextlib.suppress(OSError):
            old.close()
        if attach is None or server is None:
            return None
        self._inbox.put(DETACHED)
        log.warning("the agent went away; serving on and waiting up to %g s for the next one",
                    attach.orphan_timeout)
        deadline = time.monotonic() + attach.orphan_timeout
        while True:
            try:
                conn = rendezvous.accept(server, attach.authkey, max(deadline - time.monotonic(), 0.0))
            except OSError:  # closed under us: the worker is ending
                conn = None
            if conn is None:
                if self._server is not None:  # else the worker is closing already
                    log.warning("no agent came back within %g s; exiting", attach.orphan_timeout)
                self.close()  # an agent arriving from now on finds no listener (a stale socket) instead of waiting
                return None
            if self._greet(conn):
                log.info("adopted by a new agent")
                return conn

    def _greet(self, conn: Connection) -> bool:
        """An adopting agent asks Describe first; the answer and the switch to its connection are one step under
        the send lock, so every later lifecycle message reaches it after the description."""
        try:
            first = conn.recv() if conn.poll(rendezvous.HANDSHAKE_TIMEOUT) else None
        except (EOFError, OSError):
            first = None
        if not isinstance(first, Describe):
            conn.close()
            return False
        with self._send_lock:
            try:
                conn.send(self._description())
            except OSError:
                conn.close()
                return False
            self._conn, self._first_id = conn, self._next_id
        return True
