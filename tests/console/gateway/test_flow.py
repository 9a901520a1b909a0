"""Flow control's queue (pure): bands in order, fair shares between flows within a band, and the criticality words."""

from __future__ import annotations

import pytest

from console.gateway.flow import BANDS, FlowQueue, band_of


def test_a_band_comes_from_the_header_else_from_the_deployments_tier():
    assert band_of(None, "critical") == band_of(None, "high") == BANDS.index("critical")
    assert band_of(None, "standard") == BANDS.index("standard")
    assert band_of(None, "batch") == BANDS.index("sheddable")
    assert band_of(" Sheddable ", "critical") == BANDS.index("sheddable")  # the request's own word wins
    with pytest.raises(ValueError, match="critical, standard, sheddable"):
        band_of("urgent", "standard")


def _order(queue: FlowQueue) -> list[str]:
    out = []
    while (ticket := queue.pop()) is not None:
        out.append(ticket.waiter)
    return out


def test_a_second_flows_request_goes_before_a_floods_backlog():
    queue = FlowQueue()
    for i in range(48):
        queue.push(1, "flood", 100, f"A{i}")
    assert [queue.pop().waiter for _ in range(4)] == ["A0", "A1", "A2", "A3"]  # the flood alone: in its order
    queue.push(1, "other", 100, "B0")
    queue.push(1, "other", 100, "B1")
    order = _order(queue)
    assert order.index("B0") <= 1 and order.index("B1") <= 3  # interleaved with the flood, not behind its 44
    assert len(order) == 46


def test_fair_shares_are_counted_in_tokens():
    queue = FlowQueue()
    for i in range(6):
        queue.push(1, "long", 400, f"L{i}")
        queue.push(1, "short", 100, f"S{i}")
    order = _order(queue)
    # Four short requests cost what one long one does: all six short ones are out before the third long one.
    assert order.index("S5") < order.index("L2")


def test_higher_bands_go_first_and_a_dropped_request_is_skipped():
    queue = FlowQueue()
    sheddable = queue.push(2, "a", 1, "shed")
    queue.push(1, "a", 1, "standard")
    gone = queue.push(0, "b", 1, "left")
    queue.push(0, "a", 1, "critical")
    queue.drop(gone)
    assert len(queue) == 3 and queue.ahead(0) == 1 and queue.ahead(2) == 3
    assert _order(queue) == ["critical", "standard", "shed"]
    queue.drop(sheddable)  # already dispatched: nothing to drop
    assert len(queue) == 0


def test_a_flows_requests_that_left_are_not_charged_to_it():
    queue = FlowQueue()
    gone = [queue.push(1, "a", 100, f"A{i}") for i in range(3)]
    for ticket in reversed(gone):  # its three timed out
        queue.drop(ticket)
    queue.push(1, "b", 100, "B0")
    queue.push(1, "b", 100, "B1")
    queue.push(1, "a", 100, "A3")
    assert _order(queue) == ["B0", "A3", "B1"]  # A3's tag is not behind its three unserved requests
