"""CPU time each process of the stack spends while streams run: where two cores go (psutil, torch-free)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from bench.harness import cpu_seconds
from tests.e2e.stack import Stack


@dataclass(frozen=True)
class Roles:
    """The processes to account, by role: pid lists, so a role can hold several (workers, spares)."""

    pids: dict[str, tuple[int, ...]]

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU seconds each role has used so far (a process that is gone counts 0)."""
        return {role: cpu_seconds(pids) for role, pids in self.pids.items()}


def roles(stack: Stack, worker_pid: int) -> Roles:
    """This process (the client), the console (`manage.py up`: gateway and scheduler), the agent, the measured
    replica's worker, and every other process under the agent (other replicas, the warm spare)."""
    children = stack.descendants()
    agent = [p.pid for p in children if _is_agent(p)]
    others = [p.pid for p in children if p.pid != worker_pid and p.pid not in agent]
    return Roles({"client": (os.getpid(),), "console": (stack.proc.pid,), "agent": tuple(agent),
                  "worker": (worker_pid,), "other workers": tuple(others)})


def _is_agent(process: psutil.Process) -> bool:
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return False
    return "-m" in cmdline and "agent" in cmdline and "run" in cmdline


def usage_row(before: dict[str, float], after: dict[str, float], wall: float, tokens: int) -> dict[str, float]:
    """Each role's CPU per generated token (ms), and the cores all of them kept busy over `wall` seconds."""
    used = {role: after[role] - before[role] for role in after}
    row = {f"{role} ms/token": used[role] / tokens * 1e3 if tokens else float("nan") for role in used}
    row["total ms/token"] = sum(used.values()) / tokens * 1e3 if tokens else float("nan")
    row["cores busy"] = sum(used.values()) / wall if wall > 0 else float("nan")
    return row
