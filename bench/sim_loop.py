"""How a process of simulated agents runs: its event loop (uvloop, as the console's) and its cyclic collector
(paused while a fleet is measured). Used by bench/fleet.py and bench/fleet_procs.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Coroutine


def run_loop(main: Coroutine) -> object:
    """asyncio.run(main) on uvloop where it is installed, as the console's `up` runs: with a thousand agents' sockets
    on asyncio's own loop, its selector and socket transports took 38% of the simulator's samples in a rollout
    (py-spy), time each agent's answer waited for."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


@contextlib.asynccontextmanager
async def collector_paused() -> AsyncIterator[None]:
    """The cyclic collector off in this process while a fleet is measured, and run once after. A thousand agents'
    replicas, statuses and tasks in one heap made its collections stop every agent at once for 100-145 ms, two of
    them inside one wave at 1,000 hosts (gc.callbacks), where a real agent's heap holds one host's few replicas.
    Paused, the simulator grew to 230 MB over a 1,000-host run."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.collect()
