"""The cyclic garbage collector paused for bursts of allocation.

A scheduler pass over 10,000 replicas builds some hundred thousand short-lived objects (rows, specs, plans); each
young collection triggered along the way walks them all again, which was a quarter of a pass's time (median
1.64 s against 1.19 s without collections, in process at 1,000 hosts on PostgreSQL). They are freed by reference
counting as soon as the burst ends, so the collector is paused while it runs and resumes after. Threads overlap
(a pass, intake batches, chores): the pause lasts until the last of them ends."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0
_resume = False  # whether the collector was on when the first holder paused it


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    global _holders, _resume
    with _lock:
        if _holders == 0:
            _resume = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _resume:
                gc.enable()
