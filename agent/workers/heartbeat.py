"""Heartbeats to one worker: a ping every interval on the event loop, and a verdict when it goes silent."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 10.0


class Heartbeat:
    """Calls `ping(n)` every `interval` s; `on_silent(reason)` once no pong came for `timeout` s while `watched()`."""

    def __init__(
        self,
        ping: Callable[[int], None],
        on_silent: Callable[[str], None],
        watched: Callable[[], bool],
        interval: float = HEARTBEAT_INTERVAL,
        timeout: float = HEARTBEAT_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ping = ping
        self._on_silent = on_silent
        self._watched = watched
        self.interval = interval
        self.timeout = timeout
        self._clock = clock
        self._numbers = itertools.count(1)
        self._last_pong = clock()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Begin (once loaded); a timeout of 0 turns heartbeats off."""
        self._last_pong = self._clock()
        if self._timer is None and self.timeout > 0:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self.beat)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pong(self) -> None:
        self._last_pong = self._clock()

    def beat(self) -> None:
        """One tick: judge the silence so far, else ping and schedule the next tick."""
        self._timer = None
        if self._watched() and self._clock() - self._last_pong > self.timeout:
            self._on_silent(f"no heartbeat for {self.timeout:g} s")
            return
        self._ping(next(self._numbers))
        self._timer = asyncio.get_running_loop().call_later(self.interval, self.beat)
