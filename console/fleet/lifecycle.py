"""A host's lifecycle, the one rule every page, API, alert, gateway route and scheduler pass asks:

- connected: its agent's link is up and its lease renewed;
- unknown: its lease lapsed or its link closed (unknown_since): it keeps its replicas but gets no new ones;
- offline: evicted, unknown for longer than the eviction timeout (evicted_at): its replicas are re-placed, at a
  bounded rate (console/control/leases.py); or never leased.

Like Kubernetes nodes: a console restart never counts as hosts leaving (the scheduler's reconnect grace), and a host
that returns is fenced by its generation. Pure: the rows' facts in, a state or a cutoff out."""

from __future__ import annotations

import functools
import operator
from datetime import datetime, timedelta

from django.db.models import Q

CONNECTED, UNKNOWN, OFFLINE = "connected", "unknown", "offline"
STATES = (CONNECTED, UNKNOWN, OFFLINE)
LEASE_SWEEP_SECONDS = 1.0  # how often intake's batcher looks at the leases due (console/intake/stages.py)


def state(connected: bool, unknown_since: datetime | None, evicted_at: datetime | None) -> str:
    """The lifecycle state of a host with these facts."""
    if connected:
        return CONNECTED
    return OFFLINE if evicted_at is not None or unknown_since is None else UNKNOWN


# state() as a filter on hosts, so a page of hosts in one state is one query.
_WHERE = {
    CONNECTED: Q(connected=True),
    UNKNOWN: Q(connected=False, unknown_since__isnull=False, evicted_at__isnull=True),
    OFFLINE: Q(connected=False) & (Q(evicted_at__isnull=False) | Q(unknown_since__isnull=True)),
}


def where(*states: str) -> Q:
    """The hosts in any of `states` (of STATES), as a filter."""
    return functools.reduce(operator.or_, (_WHERE[name] for name in states))


def renewal_seconds(lease_s: float) -> float:
    """How old a host's written lease (last_seen) may grow before a message of its agent writes it again."""
    return lease_s / 4


def lapses_before(now: datetime, lease_s: float) -> datetime:
    """A connected host last seen before this has lapsed its lease: its agent may have spoken up to a renewal
    interval and a lease sweep after last_seen, its message waiting for the sweep, so a host lapses a lease, that
    interval and a sweep after it, never sooner."""
    return now - timedelta(seconds=lease_s + renewal_seconds(lease_s) + LEASE_SWEEP_SECONDS)


def evicts_before(now: datetime, eviction_s: float) -> datetime:
    """An unknown host unknown since before this is due for eviction."""
    return now - timedelta(seconds=eviction_s)


def unheard(connected: bool, last_seen: datetime | None, now: datetime, lease_s: float) -> bool:
    """Whether a host's agent has been unheard for a lease with its link down: the gateway fails its waiting
    requests over then (console/gateway/failover.py), before the scheduler has even marked it unknown."""
    return not connected and (last_seen is None or last_seen <= now - timedelta(seconds=lease_s))
