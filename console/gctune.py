"""The cyclic garbage collector's settings for the console's long-running processes (`manage.py up`, `manage.py
scheduler`; bench/fleet.py's simulator too).

With CPython's defaults (700, 10, 10) a console at 1,000 hosts ran a full collection about every second while a
10,000-replica rollout converged, 80-570 ms each with the interpreter lock held: 19 s of stopped interpreter in
two minutes (traced with gc.callbacks, docs/benchmarks.md). The event loop stood still meanwhile, so agents'
acks and reports sat unread in their sockets for up to a second. The rollout's objects (a pass's plan, the
desired states stored for the push, query results) live just long enough to survive two young collections and
reach the oldest generation, which every full collection walks whole, together with everything Django and the
imports made at start-up.

So: what exists after start-up is frozen (gc.freeze: never walked again; it mostly lives as long as the process,
and what of it dies later in a cycle is never freed, a bound of the start-up heap), and the young generation is
collected every GEN0 allocations (net, of objects the collector tracks) instead of 700, which lets a pass's
temporaries die by reference counting before a collection can promote them. Cycles are still collected: most in
the young generations, which stay cheap (tens of ms), and the rest by the full collections CPython still runs on
its own, now rarely (after GEN2 middle-generation collections)."""

from __future__ import annotations

import gc

GEN0 = 20_000  # allocations between young collections (CPython: 700)
GEN1 = 10  # young collections between middle ones (CPython's)
GEN2 = 100  # middle collections between full ones (CPython: 10; it also waits for 25% new long-lived objects)


def tune() -> None:
    """Freeze what start-up made and collect less often; call once the process has imported what it serves."""
    gc.collect()  # start-up's own garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
