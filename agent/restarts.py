"""When to restart a replica whose worker failed: exponential backoff, reset only by a worker that stayed up.

A worker that reads ready and then dies at its first request (a model its engine starts but cannot run) must not
reset the backoff each time it reads ready, or it restarts at the minimum interval forever: like Kubernetes'
CrashLoopBackOff, the run of failures ends only once a worker stayed ready for `stable_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_S = 600.0  # a worker ready this long ended its replica's run of failures


@dataclass
class RestartBackoff:
    """Consecutive failures per replica, and the delay before the next restart (pure, no I/O: times are given)."""

    minimum: float = BACKOFF_MIN_S
    maximum: float = BACKOFF_MAX_S
    stable_s: float = STABLE_S
    _failures: dict[int, int] = field(default_factory=dict)
    _total: dict[int, int] = field(default_factory=dict)  # every failure, a ready worker notwithstanding (metrics)
    _ready_at: dict[int, float] = field(default_factory=dict)  # when its current worker first read ready

    def failed(self, replica_id: int, now: float) -> float:
        """Record a failure at `now` (monotonic seconds); returns the seconds to wait before restarting."""
        ready_at = self._ready_at.pop(replica_id, None)
        if ready_at is not None and now - ready_at >= self.stable_s:
            self._failures.pop(replica_id, None)  # it stayed up: this failure starts a new run
        n = self._failures.get(replica_id, 0) + 1
        self._failures[replica_id] = n
        self._total[replica_id] = self._total.get(replica_id, 0) + 1
        return min(self.minimum * 2 ** (n - 1), self.maximum)

    def failures(self, replica_id: int) -> int:
        """Failures in the current run (no worker stayed up between them)."""
        return self._failures.get(replica_id, 0)

    def totals(self) -> dict[int, int]:
        """Failures per replica since this agent started, however many loads came between them."""
        return dict(self._total)

    def ready(self, replica_id: int, now: float) -> None:
        """Its worker is loaded at `now`: if it stays up `stable_s`, its next failure starts the count over."""
        self._ready_at.setdefault(replica_id, now)

    def forget(self, replica_id: int) -> None:
        self._failures.pop(replica_id, None)
        self._total.pop(replica_id, None)
        self._ready_at.pop(replica_id, None)
