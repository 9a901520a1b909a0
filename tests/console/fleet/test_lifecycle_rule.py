"""The host lifecycle's one rule (console/fleet/lifecycle.py), as a table: the facts of a host's row in, its state
out; and the cutoffs for a lease lapsing, an eviction falling due and a host unheard."""

from datetime import UTC, datetime, timedelta

import pytest

from console.fleet import lifecycle

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(minutes=5)


@pytest.mark.parametrize(("connected", "unknown_since", "evicted_at", "state"), [
    (True, None, None, "connected"),
    (True, EARLIER, None, "connected"),  # its link is up: whatever the row says besides
    (True, EARLIER, NOW, "connected"),
    (False, EARLIER, None, "unknown"),  # its lease lapsed or its link closed: it keeps its replicas
    (False, EARLIER, NOW, "offline"),  # evicted: its replicas are re-placed
    (False, None, NOW, "offline"),
    (False, None, None, "offline"),  # never leased
])
def test_the_state_of_a_host_is_one_rule(connected, unknown_since, evicted_at, state):
    assert lifecycle.state(connected, unknown_since, evicted_at) == state


def test_every_state_is_named_once():
    assert lifecycle.STATES == ("connected", "unknown", "offline")


@pytest.mark.parametrize(("lease_s", "lapses_after_s"), [
    (20.0, 20 + 5 + lifecycle.LEASE_SWEEP_SECONDS),  # a lease, a renewal interval (a quarter) and a sweep
    (4.0, 4 + 1 + lifecycle.LEASE_SWEEP_SECONDS),
])
def test_a_lease_lapses_a_lease_a_renewal_and_a_sweep_after_it_was_written(lease_s, lapses_after_s):
    assert lifecycle.lapses_before(NOW, lease_s) == NOW - timedelta(seconds=lapses_after_s)


def test_an_unknown_host_is_due_for_eviction_after_the_timeout():
    assert lifecycle.evicts_before(NOW, 60.0) == NOW - timedelta(seconds=60)


@pytest.mark.parametrize(("connected", "last_seen", "unheard"), [
    (True, None, False),  # its link is up
    (True, NOW - timedelta(hours=1), False),
    (False, None, True),  # never heard
    (False, NOW - timedelta(seconds=20), True),  # a lease ago, to the second
    (False, NOW - timedelta(seconds=19), False),
])
def test_a_host_is_unheard_with_its_link_down_for_a_lease(connected, last_seen, unheard):
    assert lifecycle.unheard(connected, last_seen, NOW, 20.0) is unheard
