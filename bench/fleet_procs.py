"""The simulated fleet split over several processes, each running a `SimFleet` of its share of the agents.

Why: in one process every agent shares one event loop, so a wave of pushes to a thousand hosts is parsed,
converged and acked one after another there (the loop ran 230-550 ms late in 1,000-host waves), where real
agents, one per machine, answer at once; that wait lands inside both legs of push -> ack. Spread over a few
processes, the agents of a wave answer in parallel as far as the machine's cores allow.

The parent sees the same things bench/fleet.py reads of a `SimFleet`: counts while converging (`refresh()`
fetches them), and each agent's metrics and the loops' lag once `collect()` has fetched them. Times are
`time.monotonic()`, one clock for every process on Linux (CLOCK_MONOTONIC), so they compare with the parent's.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
from dataclasses import dataclass
from typing import Any

import psutil

from bench.fleet_sim import AgentMetrics, SimFleet, SimSpec
from bench.sim_loop import collector_paused, run_loop

STOP_S = 30.0  # a child that does not stop after its agents are told to is killed


@dataclass
class AgentView:
    """An agent in another process as the parent last saw it: its metrics, from `collect()`."""

    metrics: AgentMetrics


class ProcessFleet:
    """`async with ProcessFleet(console, tokens, spec, connect_concurrency, processes) as fleet:` starts the
    children, each with every `processes`-th agent (by name), and stops them on exit."""

    def __init__(self, console: str, tokens: dict[str, str], spec: SimSpec = SimSpec(),
                 connect_concurrency: int = 50, processes: int = 2) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        names = sorted(tokens)
        self._shares = [{n: tokens[n] for n in names[k::processes]} for k in range(min(processes, len(names)) or 1)]
        self._console, self._spec = console, spec
        self._concurrency = max(1, connect_concurrency // len(self._shares))
        self._children: list[tuple[Any, Any]] = []  # (process, parent's end of its pipe)
        self._connected, self._ready, self._states = 0, {}, collections.Counter()
        self.agents: dict[str, AgentView] = {}
        self.loop_lag: list[tuple[float, float]] = []

    async def __aenter__(self) -> ProcessFleet:
        context = multiprocessing.get_context("spawn")  # no fork of this process's event loop and threads
        for share in self._shares:
            mine, theirs = context.Pipe()
            process = context.Process(target=_child, args=(theirs, self._console, share, self._spec,
                                                           self._concurrency), daemon=True)
            process.start()
            theirs.close()
            self._children.append((process, mine))
        return self

    async def __aexit__(self, *exc) -> None:
        for _, conn in self._children:
            try:
                conn.send("stop")
            except OSError:  # it died already
                pass
        for process, conn in self._children:
            await asyncio.to_thread(process.join, STOP_S)
            if process.is_alive():
                process.kill()
            conn.close()

    async def _ask(self, what: str) -> list[Any]:
        for _, conn in self._children:
            conn.send(what)
        return await asyncio.gather(*(asyncio.to_thread(conn.recv) for _, conn in self._children))

    async def refresh(self) -> None:
        """Fetch every child's counts: what connected(), ready() and states() answer until the next refresh."""
        answers = await self._ask("summary")
        self._connected = sum(a[0] for a in answers)
        self._states = sum((collections.Counter(a[1]) for a in answers), collections.Counter())
        self._ready = {rid: t for a in answers for rid, t in a[2].items()}

    async def collect(self) -> None:
        """Fetch every agent's metrics and every child's loop lag."""
        answers = await self._ask("report")
        self.agents = {name: AgentView(m) for metrics, _ in answers for name, m in metrics.items()}
        self.loop_lag = sorted(sample for _, lag in answers for sample in lag)

    def processes(self) -> list[psutil.Process]:
        return [psutil.Process(p.pid) for p, _ in self._children if p.is_alive()]

    def connected(self) -> int:
        return self._connected

    def ready(self) -> dict[int, float]:
        return dict(self._ready)

    def states(self) -> dict[str, int]:
        return dict(self._states)

    wait_for = SimFleet.wait_for  # each poll refreshes first


def _child(conn, console: str, tokens: dict[str, str], spec: SimSpec, concurrency: int) -> None:
    from console.gctune import tune

    tune()  # as in the parent: a few hundred agents' objects, and no full collection stalling them all at once
    run_loop(_serve(conn, console, tokens, spec, concurrency))


async def _serve(conn, console: str, tokens: dict[str, str], spec: SimSpec, concurrency: int) -> None:
    async with SimFleet(console, tokens, spec, concurrency) as fleet, collector_paused():  # as the parent measures
        while True:
            try:
                what = await asyncio.to_thread(conn.recv)
            except EOFError:  # the parent is gone
                return
            if what == "summary":
                conn.send((fleet.connected(), fleet.states(), fleet.ready()))
            elif what == "report":
                conn.send(({name: a.metrics for name, a in fleet.agents.items()}, fleet.loop_lag))
            else:
                return
