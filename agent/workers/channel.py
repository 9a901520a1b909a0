"""The worker's end of its pipe: a reader thread answers heartbeats at once and queues the rest (no torch).

The worker's main thread spends seconds in loads, copies and forward passes without reading its pipe.
Pings are answered from the reader thread, so a worker is judged alive while it works and dead only
when the whole process stops (frozen, stuck holding the GIL, or gone). What crosses the pipe is
agent.workers.messages.
"""

from __future__ import annotations

import queue
import threading
from multiprocessing.connection import Connection

from agent.workers.messages import AgentMessage, Ping, Pong, WorkerMessage


class WorkerChannel:
    """Thread-safe sends; `recv()` gives the next non-ping message, or None once the agent is gone."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._inbox: queue.Queue[AgentMessage | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="modelgrid-worker-pipe", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def recv(self) -> AgentMessage | None:
        """Block until the next command from the agent; None when the pipe closed."""
        return self._inbox.get()

    def take(self, wait: bool) -> list[AgentMessage | None]:
        """Every message waiting now (None marks the pipe closed); with `wait`, block until there is one."""
        messages = [self._inbox.get()] if wait else []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def send(self, message: WorkerMessage) -> bool:
        """Send one message; False when the agent is gone."""
        with self._send_lock:  # the reader thread sends pongs while the main thread sends results
            try:
                self._conn.send(message)
                return True
            except (BrokenPipeError, EOFError, OSError):
                return False

    def close(self) -> None:
        self._conn.close()

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._inbox.put(None)
                return
            if isinstance(message, Ping):
                self.send(Pong(message.number))
            else:
                self._inbox.put(message)
