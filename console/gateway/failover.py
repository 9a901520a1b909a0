"""Requests waiting for a replica's answer, by replica. When a snapshot of the fleet finds that replica's host lost
(no longer connected, Host.lifecycle's rule, and its agent unheard for a lease: HostView.lost), the requests still
waiting for their answer's headers are cancelled, so that each goes once to another replica (proxy.py): nothing
reached their clients yet, and a paused agent finds the connection closed when it wakes. An answer that has begun is
never sent elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping

from console.gateway.fleet import HostView, ReplicaView

# A host's state, as a refusal names it.
STATE_WORDS = {"connected": "connected", "unknown": "unknown: its lease lapsed or its link closed",
               "offline": "offline: its replicas are re-placed"}


class HostLost(Exception):
    """The replica's host left the connected state before the replica answered."""


class Wait:
    """One request waiting for one replica's answer."""

    __slots__ = ("replica", "task", "lost")

    def __init__(self, replica: ReplicaView, task: asyncio.Task) -> None:
        self.replica, self.task = replica, task
        self.lost = ""  # the host's state, once it was found not connected


class Waiting:
    """The requests waiting for answers in one gateway, by replica id."""

    def __init__(self) -> None:
        self._by_replica: dict[int, set[Wait]] = {}

    @contextlib.contextmanager
    def on(self, replica: ReplicaView) -> Iterator[Wait]:
        """Count the current task as waiting for `replica`'s answer while the block runs."""
        wait = Wait(replica, asyncio.current_task())
        self._by_replica.setdefault(replica.id, set()).add(wait)
        try:
            yield wait
        finally:
            waits = self._by_replica[replica.id]
            waits.discard(wait)
            if not waits:
                del self._by_replica[replica.id]

    def lapse(self, hosts: Mapping[str, HostView]) -> int:
        """Cancel the waits on replicas whose host `hosts` (a new snapshot's) has lost, or no longer has; how many."""
        cancelled = 0
        for waits in self._by_replica.values():
            for wait in waits:
                if not wait.replica.host or wait.lost:
                    continue
                host = hosts.get(wait.replica.host)
                if host is None or host.lost:  # (a deleted host is gone for good)
                    wait.lost = host.state if host is not None else "offline"
                    wait.task.cancel()
                    cancelled += 1
        return cancelled


def host_state(hosts: Mapping[str, HostView], name: str) -> str:
    """`host NAME is STATE` as a refusal says it."""
    host = hosts.get(name)
    state = host.state if host is not None else "offline"
    return f"host {name} is {STATE_WORDS.get(state, state)}"
