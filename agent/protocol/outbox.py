"""One agent link's outgoing messages, in the order they were posted (acknowledgements first), with replica state
changes coalesced.

A state change does not queue a message of its own: it asks for a report, and while a report waits to be sent
every further change rides in it. The report is built when its turn comes to be sent, so it says what holds then.
An apply that starts ten workers thus costs the console one report besides its ack, not a report and a status per
worker (at a thousand hosts that was 21,000 messages for the console to read before the last ack). A replica gone
by the time the report is built (stopped) is reported with the status its change gave.
An ack goes ahead of whatever else waits: the console times a rollout by its acks, and in a wave it reads a
thousand hosts' messages in turn, so an ack behind its host's report waited for every report read before it. No
meaning rides on that order: the console commits an ack before the statuses that came with it either way.
Loading progress, frequent and small, is a status of its own unless a waiting report will carry it: sent after that
report it would tell the console of a state older than the report's. The real agent (agent/daemon.py) and the
fleet simulator (bench/fleet_sim.py) both send through this."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from pydantic import BaseModel

from agent.protocol.messages import Ack, HostReport, ReplicaStatus, dump

_REPORT = None  # a report's place in the queue
_ACK, _OTHER = 0, 1  # what is sent first


class Outbox:
    """`build_report(gone)` makes the report to send now; `gone` are the statuses of the replicas changed since the
    last report, for the builder to pass to Reporter.report (which tells those it no longer has)."""

    def __init__(self, build_report: Callable[[list[ReplicaStatus]], HostReport]) -> None:
        self._build = build_report
        # (rank, order posted, message): acks first, each rank in the order posted.
        self._queue: asyncio.PriorityQueue[tuple[int, int, str | None]] = asyncio.PriorityQueue()
        self._order = itertools.count()
        self._changes: dict[int, ReplicaStatus] = {}
        self._report_waiting = False

    def post(self, message: BaseModel) -> None:
        self._queue.put_nowait((_ACK if isinstance(message, Ack) else _OTHER, next(self._order), dump(message)))

    def report(self) -> None:
        """Ask for a report; one already waiting to be sent answers this too."""
        if not self._report_waiting:
            self._report_waiting = True
            self._queue.put_nowait((_OTHER, next(self._order), _REPORT))

    def changed(self, status: ReplicaStatus) -> None:
        """A replica's state changed: the next report carries it."""
        self._changes[status.replica_id] = status
        self.report()

    def progress(self, status: ReplicaStatus) -> None:
        """A loading replica read more of its weights."""
        if self._report_waiting:
            self._changes[status.replica_id] = status
        else:
            self.post(status)

    async def get(self) -> str:
        """The next message to send; call task_done() once it is sent."""
        *_, item = await self._queue.get()
        if item is _REPORT:
            self._report_waiting = False
            gone, self._changes = list(self._changes.values()), {}
            try:
                item = dump(self._build(gone))
            except BaseException:
                self._queue.task_done()  # nothing to send: join() must not wait for it
                raise
        return item

    def task_done(self) -> None:
        self._queue.task_done()

    def empty(self) -> bool:
        return self._queue.empty()

    async def join(self) -> None:
        """Until every message posted so far was sent."""
        await self._queue.join()
