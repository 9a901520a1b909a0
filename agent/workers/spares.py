"""Warm spare workers: processes spawned ahead of need that have already imported torch (no torch here).

A replica's worker spends most of its start importing torch and transformers. The pool keeps a few
processes that did that already and wait on their connection for a Load message; the supervisor adopts
one instead of spawning cold. A spare knows no replica and no device, so it serves any of them.
Spares are not replicas: nothing reports them, `close()` stops them all, and they die with the agent
(they hold no model, so nothing is lost; only a spare turned replica outlives its agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from multiprocessing.connection import Connection
from typing import Any

from agent.workers.processes import spawn_worker

log = logging.getLogger(__name__)

MAX_FAILURES = 3  # spares dying in a row before the pool gives up (replicas then start cold)
BACKOFF_S = 1.0  # the first delay before replacing a spare that died; doubles on each death

__all__ = ["BACKOFF_S", "MAX_FAILURES", "Spare", "SparePool", "spawn_worker"]


class Spare:
    """One spare process (agent.workers.processes) and the agent's end of its connection."""

    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.pid: int = process.pid
        self.exited = asyncio.Event()


class SparePool:
    """Keeps `size` spares spawned; `take()` hands one over and a replacement is spawned soon after."""

    def __init__(self, size: int, stop_timeout: float) -> None:
        self.size = max(0, size)
        self._stop_timeout = stop_timeout
        self._spares: list[Spare] = []
        self._failures = 0  # spares that died in a row, unasked
        self._refill: asyncio.TimerHandle | None = None
        self._closed = False

    def spares(self) -> list[Spare]:
        """The spares waiting now (for tests and logs)."""
        return list(self._spares)

    def fill(self) -> None:
        """Spawn spares up to the pool's size; call from the event loop that watches them."""
        self._refill = None
        while not self._closed and len(self._spares) < self.size and self._failures < MAX_FAILURES:
            try:
                process, conn = spawn_worker(spare=True)
            except OSError as e:  # process or fd limits: replicas still start cold
                log.warning("cannot start a warm spare worker: %s", e)
                return
            spare = Spare(process, conn)
            asyncio.get_running_loop().add_reader(process.sentinel, self._on_exit, spare)
            self._spares.append(spare)
            log.info("warm spare worker pid %d started", spare.pid)

    def take(self) -> Spare | None:
        """A spare to adopt (it may still be importing: its load message then waits in the pipe), or None."""
        while self._spares:
            spare = self._spares[0]
            if not spare.process.is_alive():  # died, and the exit watcher has not run yet
                self._on_exit(spare)
                continue
            self._spares.pop(0)
            asyncio.get_running_loop().remove_reader(spare.process.sentinel)
            self._failures = 0  # spares do work here; a later run of deaths starts its count afresh
            self._schedule(0.0)  # the replacement starts after the caller has sent its spec
            return spare
        return None

    async def close(self) -> None:
        """Stop every spare (SIGTERM, then SIGKILL) and spawn no more."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        spares, self._spares = self._spares, []
        await asyncio.gather(*(self._stop(spare) for spare in spares))

    async def _stop(self, spare: Spare) -> None:
        for signal_it in (spare.process.terminate, spare.process.kill):
            with contextlib.suppress(ProcessLookupError, OSError):
                signal_it()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(spare.exited.wait(), self._stop_timeout)
            if spare.exited.is_set():
                break
        self._reap(spare)  # join() waits out a kill whose exit the watcher missed

    def _on_exit(self, spare: Spare) -> None:
        if spare not in self._spares:  # stopping: close() reaps it
            self._reap(spare)
            return
        self._spares.remove(spare)
        self._reap(spare)
        self._failures += 1
        if self._failures >= MAX_FAILURES:
            log.warning(
                "warm spare worker pid %d exited (code %s); %d died in a row, so replicas start cold from now on",
                spare.pid,
                spare.process.exitcode,
                self._failures,
            )
            return
        delay = BACKOFF_S * 2 ** (self._failures - 1)
        log.warning(
            "warm spare worker pid %d exited (code %s); replacing it in %g s", spare.pid, spare.process.exitcode, delay
        )
        self._schedule(delay)

    def _schedule(self, delay: float) -> None:
        if not self._closed and self._refill is None:
            self._refill = asyncio.get_running_loop().call_later(delay, self.fill)

    def _reap(self, spare: Spare) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(spare.process.sentinel)
        spare.process.join(1.0)  # the sentinel fired or a kill was sent: this is immediate
        spare.exited.set()
        spare.conn.close()
        spare.process.close()
