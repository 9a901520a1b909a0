"""When a plan can change by the clock alone.

Every rule of the planner that reads the time compares how long ago something happened with a fixed length: an
idle timeout since a deployment's last request, a scale cooldown since its last change, a quiet window since it
last entered its SLO, a replica's minimum residency since it was placed or woken, its idle grace since its last
request. Each such comparison turns once, at a moment the input fixes (`since + length`), and never back as time
goes on. So planning the same input again gives the same plan until the earliest of those moments still ahead:
the console's loop needs no pass before then unless the input itself changed.
"""

from __future__ import annotations

from collections.abc import Iterator

from console.scheduler.types import PlanInput


def next_change(request: PlanInput) -> float | None:
    """The earliest moment after `request.now` at which planning the same input could decide differently (any
    time rule turning), or None when none can. Conservative: a moment may turn a rule that changes nothing."""
    ahead = [t for t in _turning_points(request) if t > request.now]
    return min(ahead) if ahead else None


def _turning_points(request: PlanInput) -> Iterator[float]:
    s = request.settings
    for d in request.deployments:
        if d.idle_timeout_s is not None and d.active_at is not None:
            yield d.active_at + d.idle_timeout_s  # scaling.idle_cause
        if d.last_scale_at is not None:
            yield d.last_scale_at + s.cooldown_s  # scaling._decide: the cooldown
        if d.status_since is not None:
            yield d.status_since + s.quiet_window_s  # scaling._decide: the quiet window
    for r in request.replicas:
        if r.ready_since is not None:
            yield r.ready_since + s.min_residency_s  # units.within_residency, demand._evictable
        if r.last_request_at is not None:
            yield r.last_request_at + s.idle_grace_s  # demand.idle_for, demand._evictable
