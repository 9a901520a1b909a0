"""The host-RAM budget for sleeping replicas: which may keep their weights in host memory (pure, no I/O).

Sleeping replicas hold their weights in (pinned) host memory. Together they must fit the agent's
`--sleep-budget`; when they do not, the least recently used are stopped (their worker ends and the
weights go back to disk), each with a reason. A replica larger than the whole budget never sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sleeper:
    """A replica that sleeps, or is about to, and the host bytes that takes."""

    replica_id: int
    bytes: int
    last_used: float  # monotonic seconds of its last request, wake or load


def fit(sleepers: list[Sleeper], budget: int) -> dict[int, str]:
    """The replicas that must not sleep (replica id -> reason) so that the rest fit `budget` bytes."""
    dropped: dict[int, str] = {}
    for s in sleepers:
        if s.bytes > budget:
            dropped[s.replica_id] = (
                f"stopped instead of sleeping: its {_mib(s.bytes)} of weights exceed the host-RAM budget "
                f"for sleeping replicas ({_mib(budget)}; raise --sleep-budget to keep it asleep)"
            )
    kept = [s for s in sleepers if s.replica_id not in dropped]
    total = sum(s.bytes for s in kept)
    for s in sorted(kept, key=lambda s: (s.last_used, s.replica_id)):
        if total <= budget:
            break
        dropped[s.replica_id] = (
            f"evicted from host memory: sleeping replicas needed {_mib(total)}, more than the host-RAM budget "
            f"of {_mib(budget)} (--sleep-budget), and it was the least recently used"
        )
        total -= s.bytes
    return dropped


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"
