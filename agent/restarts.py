"""When to restart a replica whose worker failed: exponential backoff, reset by a ready worker."""

from __future__ import annotations

from dataclasses import dataclass, field

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 60.0


@dataclass
class RestartBackoff:
    """Consecutive failures per replica, and the delay before the next restart (pure, no I/O)."""

    minimum: float = BACKOFF_MIN_S
    maximum: float = BACKOFF_MAX_S
    _failures: dict[int, int] = field(default_factory=dict)
    _total: dict[int, int] = field(default_factory=dict)  # every failure, a ready worker notwithstanding (metrics)

    def failed(self, replica_id: int) -> float:
        """Record a failure; returns the seconds to wait before restarting."""
        n = self._failures.get(replica_id, 0) + 1
        self._failures[replica_id] = n
        self._total[replica_id] = self._total.get(replica_id, 0) + 1
        return min(self.minimum * 2 ** (n - 1), self.maximum)

    def failures(self, replica_id: int) -> int:
        return self._failures.get(replica_id, 0)

    def totals(self) -> dict[int, int]:
        """Failures per replica since this agent started, however many loads came between them."""
        return dict(self._total)

    def ready(self, replica_id: int) -> None:
        """A ready worker ends the run of failures."""
        self._failures.pop(replica_id, None)

    def forget(self, replica_id: int) -> None:
        self._failures.pop(replica_id, None)
        self._total.pop(replica_id, None)
