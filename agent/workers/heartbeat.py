"""Heartbeats to one worker: a ping every interval on the event loop, and a verdict when it goes silent.

Silence is counted in the agent's own waking time: a tick that comes late (the agent was paused, or its
loop was blocked) adds at most LATE_TICK_LIMIT intervals, so an agent never kills a worker for its own
silence; the worker still gets the whole timeout of the agent's attention to answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 10.0
LATE_TICK_LIMIT = 2.0  # intervals one tick may add to a worker's silence, however late it came

log = logging.getLogger(__name__)


class Heartbeat:
    """Calls `ping(n)` every `interval` s; `on_silent(reason)` once no pong came for `timeout` s of the agent's
    waking time while `watched()`."""

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
        self._last_tick = clock()
        self._silence = 0.0  # waking seconds since the last pong
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Begin (once loaded); a timeout of 0 turns heartbeats off."""
        self._last_tick, self._silence = self._clock(), 0.0
        if self._timer is None and self.timeout > 0:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self.beat)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pong(self) -> None:
        self._silence = 0.0

    def beat(self) -> None:
        """One tick: judge the silence so far, else ping and schedule the next tick."""
        self._timer = None
        now = self._clock()
        elapsed, self._last_tick = now - self._last_tick, now
        if elapsed > LATE_TICK_LIMIT * self.interval:
            log.warning("this agent's event loop did not run for %.1f s; its workers are not blamed for it", elapsed)
        self._silence += min(elapsed, LATE_TICK_LIMIT * self.interval)
        if self._watched() and self._silence > self.timeout:
            self._on_silent(f"no heartbeat for {self.timeout:g} s")
            return
        self._ping(next(self._numbers))
        self._timer = asyncio.get_running_loop().call_later(self.interval, self.beat)
