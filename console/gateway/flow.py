"""Flow control: who gets a deployment's next free replica slot when every slot is taken.

Requests wait in bands, critical before standard before sheddable. Within a band, flows (one per API token) share
the slots fairly by tokens: start-time fair queueing, where each request is tagged with a virtual finish of its
flow's previous finish (or the band's virtual time, whichever is later) plus its cost, and the smallest tag goes
first. A flood of one token only ever queues behind itself; another token's request goes ahead of the flood's
backlog as soon as it arrives. Every caller of a deployment is of its team, so within a deployment a team's fair
share is its keys'. Which flows may take a slot at all (none holding more than its share) is the gateway's to say.

Pure: the waiters are opaque, nothing here reads a clock or awaits.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

BANDS = ("critical", "standard", "sheddable")
CRITICALITY_HEADER = "x-modelgrid-criticality"
TIER_BAND = {"critical": 0, "high": 0, "standard": 1, "batch": 2}  # a request without the header: its deployment's


def band_of(header: str | None, tier: str) -> int:
    """A request's band: its header's word, else its deployment's tier's; ValueError naming the words otherwise."""
    if header is None:
        return TIER_BAND.get(tier, 1)
    word = header.strip().lower()
    if word not in BANDS:
        raise ValueError(f"the {CRITICALITY_HEADER} header must be one of {', '.join(BANDS)}, got {header[:40]!r}")
    return BANDS.index(word)


@dataclass(order=True)
class Ticket:
    band: int
    finish: float  # virtual finish tag within its band
    seq: int
    flow: str = field(compare=False)
    cost: float = field(compare=False)
    waiter: object = field(compare=False)
    live: bool = field(compare=False, default=True)


class FlowQueue:
    """One deployment's waiting requests."""

    def __init__(self) -> None:
        self._heap: list[Ticket] = []
        self._vtime = [0.0] * len(BANDS)  # the start tag of each band's last request dispatched
        self._last: dict[tuple[int, str], float] = {}  # (band, flow) -> its last request's finish tag
        self._seq = itertools.count()
        self.counts = [0] * len(BANDS)  # live tickets per band

    def __len__(self) -> int:
        return sum(self.counts)

    def push(self, band: int, flow: str, cost: float, waiter: object) -> Ticket:
        start = max(self._vtime[band], self._last.get((band, flow), 0.0))
        ticket = Ticket(band, start + max(cost, 1.0), next(self._seq), flow, max(cost, 1.0), waiter)
        self._last[band, flow] = ticket.finish
        heapq.heappush(self._heap, ticket)
        self.counts[band] += 1
        return ticket

    def pop(self, eligible: Callable[[str], bool] | None = None) -> Ticket | None:
        """The next request to dispatch (the lowest band, then the smallest finish tag) of a flow that is `eligible`
        (one holding its share of the slots is not), or None."""
        aside, found = [], None
        while self._heap and found is None:
            ticket = heapq.heappop(self._heap)
            if not ticket.live:
                continue
            if eligible is not None and not eligible(ticket.flow):
                aside.append(ticket)
            else:
                found = ticket
        for ticket in aside:
            heapq.heappush(self._heap, ticket)
        if found is not None:
            self._take(found)
            self._vtime[found.band] = max(self._vtime[found.band], found.finish - found.cost)
            if len(self._last) > 4 * len(self._heap) + 64:  # flows idle since: their tags are behind virtual time
                self._last = {k: f for k, f in self._last.items() if f > self._vtime[k[0]]}
        return found

    def drop(self, ticket: Ticket) -> None:
        """A waiting request that left (timed out, its client gone): no longer counted, skipped when reached, and, if
        it was its flow's last, no longer charged to it."""
        if ticket.live:
            self._take(ticket)
            key = (ticket.band, ticket.flow)
            if self._last.get(key) == ticket.finish:
                self._last[key] = ticket.finish - ticket.cost
            if len(self._heap) > 2 * len(self) + 64:
                self._heap = [t for t in self._heap if t.live]
                heapq.heapify(self._heap)

    def ahead(self, band: int) -> int:
        """Requests that would go before a new one of `band` (its own band's, as an upper bound, and higher ones')."""
        return sum(self.counts[: band + 1])

    def _take(self, ticket: Ticket) -> None:
        ticket.live = False
        self.counts[ticket.band] -= 1
