"""How a deployment stands for a client right now, in one word: ready, waking, asleep, cold, standby or blocked.
The dashboard, the deployment page, the API and the gateway's /v1/models all read it from here."""

from __future__ import annotations

from collections.abc import Iterable

READY, WAKING, ASLEEP, COLD, STANDBY, BLOCKED = "ready", "waking", "asleep", "cold", "standby", "blocked"

# What a client should expect of its next request: ready answers at once; waking is on its way to a GPU
# (placed, loading or waking); asleep wakes from host RAM on demand; cold loads from disk on demand;
# standby is loaded but takes no requests until the operator turns standby off; blocked: the scheduler cannot
# place a replica as things stand, so a request gets 503 with its reason.
SERVING_STATES = (READY, WAKING, ASLEEP, COLD, STANDBY, BLOCKED)
REFUSED = ("refused", "blocked")  # the scheduler's answers (a deployment's demand_status) that mean a 503 now
# The same in words, for the pages and for the gateway's "not ready" answers.
SERVING_HINTS = {
    READY: "answers at once",
    WAKING: "a replica is on its way to a GPU; requests wait for it",
    ASLEEP: "in host RAM; the next request wakes it",
    COLD: "on disk; the next request loads it",
    STANDBY: "loaded, but takes no requests until standby is turned off",
    BLOCKED: "no replica can be placed as things stand; a request gets 503 with the scheduler's reason",
}


def serving_state(replicas: Iterable, standby: bool = False, demand_status: str = "") -> str:
    """The word for replica rows (anything with desired_state, observed_state and host_id) and the scheduler's
    answer to requests for them (`demand_status`: "blocked" or "refused" when a request gets 503 now)."""
    if standby:
        return STANDBY
    rows = list(replicas)
    if any(r.desired_state == "ready" and r.observed_state == "ready" for r in rows):
        return READY
    if demand_status in REFUSED:
        return BLOCKED
    if any(r.desired_state == "ready" and r.host_id is not None for r in rows):
        return WAKING
    # Asked to sleep but stopped instead (vLLM cannot sleep on CPU): on disk, like any stopped replica.
    if any(r.observed_state == "sleeping" or (r.desired_state == "sleeping" and r.observed_state != "stopped")
           for r in rows):
        return ASLEEP
    return COLD


def start_estimate(replicas: Iterable) -> float | None:
    """Seconds a request waits for one of these replicas (rows with start_seconds) to start from disk: the quickest
    of their last measured loads; None where none was measured yet."""
    measured = [r.start_seconds for r in replicas if r.start_seconds]
    return min(measured) if measured else None
