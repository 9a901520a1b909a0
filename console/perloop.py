"""State kept per event loop: one loop per console process in production, a loop per test in the suite."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def for_this_loop(table: dict[asyncio.AbstractEventLoop, T], make: Callable[[], T]) -> T:
    """The running loop's entry of `table`, made on first use; entries of loops closed since are dropped then."""
    loop = asyncio.get_running_loop()
    found = table.get(loop)
    if found is None:
        for stale in [lp for lp in table if lp.is_closed()]:
            del table[stale]
        found = table[loop] = make()
    return found
