"""Replica counts: up at once for an SLO violation, down one at a time after a quiet window, never within a cooldown.

Batch deployments take leftovers: they ask for their maximum and get whatever room is left. Requests waiting
at the gateway (demand) ask for at least one replica; requests backed up behind ready replicas (a backlog) ask
for one more than are ready, at once (no cooldown), up to max_replicas, and hold off any scale-down. A deployment
with min_replicas 0 that saw no request for its idle_timeout_s is idle: it keeps its replica count, but none of
its replicas stays on a GPU (scale to zero).
"""

from __future__ import annotations

import math
from functools import cache

from console.scheduler.explain import backed_up, seconds, slo_text
from console.scheduler.types import Deployment, ScaleDecision, Settings


@cache
def _fixed(n: int) -> str:
    return f"fixed at {n} replica{'s' if n != 1 else ''}"


def decide(dep: Deployment, now: float, settings: Settings) -> ScaleDecision:
    """The replica count `dep` should have this pass, and why: at least one while requests wait for it, one more
    than are ready while they are backed up behind ready ones."""
    decision = _decide(dep, now, settings)
    if backlogged(dep):
        return _for_backlog(dep, decision)
    if dep.demand > 0 and decision.target == 0 and dep.high > 0:
        waiting = "a request is waiting" if dep.demand == 1 else f"{dep.demand} requests are waiting"
        change = "stays at 1 replica" if decision.current == 1 else f"{decision.current} -> 1 replica"
        return ScaleDecision(dep.name, decision.current, 1, f"{waiting}: {change}")
    return decision


def backlogged(dep: Deployment) -> bool:
    """Whether requests are backed up at the gateway behind ready replicas of `dep`: it asks for one more."""
    return dep.demand > 0 and dep.ready_replicas > 0


def _plural(n: int) -> str:
    return f"{n} replica{'s' if n != 1 else ''}"


def _for_backlog(dep: Deployment, decision: ScaleDecision) -> ScaleDecision:
    """One replica more than are ready, up to max_replicas, and never fewer than are wanted now: those above the
    ready ones are on their way, and asking for more before they are ready would run up to the maximum. No
    cooldown holds it back: the requests wait now."""
    ready, high, current = dep.ready_replicas, dep.high, decision.current
    want = min(max(current, ready + 1), high)
    if decision.target > want:  # the SLO loop asks for more
        return decision
    backed = backed_up(dep.demand)
    if ready >= high:
        reason = f"{decision.reason}; {backed}, but it is at its maximum of {_plural(high)}" \
            if decision.target == want else f"{backed}: stays at {_plural(want)}, its maximum"
        return ScaleDecision(dep.name, current, want, reason)
    if want > current:
        return ScaleDecision(dep.name, current, want, f"{backed}: {current} -> {_plural(want)}")
    coming = current - ready
    return ScaleDecision(dep.name, current, want, f"{backed}: stays at {_plural(current)} ({ready} ready, {coming} "
                         f"on {'its' if coming == 1 else 'their'} way)")


def idle_cause(dep: Deployment, now: float) -> str:
    """Why `dep` is scaled to zero this pass ("idle for 312 s (idle_timeout_s 300)"), or "" when it is not idle."""
    if dep.idle_timeout_s is None or dep.active_at is None or dep.demand > 0 or dep.low > 0:
        return ""
    idle = now - dep.active_at
    if idle < dep.idle_timeout_s:
        return ""
    return f"idle for {idle:.0f} s (idle_timeout_s {dep.idle_timeout_s:g})"


def _decide(dep: Deployment, now: float, settings: Settings) -> ScaleDecision:
    low, high = dep.low, dep.high
    current = min(max(dep.replicas, low), high)
    if low == high:
        return ScaleDecision(dep.name, current, low, _fixed(low))
    if dep.priority == "batch":
        return ScaleDecision(dep.name, current, high, f"batch: asks for its maximum of {high}, placed only in "
                             "the room left after every other tier")
    since_change = None if dep.last_scale_at is None else now - dep.last_scale_at
    cooling = since_change is not None and since_change < settings.cooldown_s
    cooldown_note = "" if since_change is None else \
        f"within the cooldown ({seconds(since_change)} of {seconds(settings.cooldown_s)} since the last change)"
    status = slo_text(dep.slo_latency_ms, dep.observed_latency_ms, dep.is_violating)
    if dep.is_violating:
        if current >= high:
            return ScaleDecision(dep.name, current, current, f"{status}; already at its maximum of {high}")
        if cooling:
            return ScaleDecision(dep.name, current, current, f"{status}, but {cooldown_note}: stays at {current}")
        target = current + 1
        if dep.slo_latency_ms and dep.observed_latency_ms and current > 0:
            # Linear estimate: twice the target latency wants twice the replicas.
            target = max(target, math.ceil(current * dep.observed_latency_ms / dep.slo_latency_ms))
        target = min(target, high)
        return ScaleDecision(dep.name, current, target, f"{status}: {current} -> {target} replicas (max {high})")
    if current <= low:
        return ScaleDecision(dep.name, current, current, f"{status}; at its minimum of {low}")
    if current == 1 and low == 0:
        # The last replica of a scale-to-zero deployment is not taken away by the SLO loop: the idle timeout
        # moves it off its GPU but keeps it (asleep, a fast wake), where removing it would cost a cold load.
        return ScaleDecision(dep.name, current, current, f"{status}; its last replica leaves its GPU only when "
                             "idle (idle_timeout_s)")
    quiet_for = None if dep.status_since is None else now - dep.status_since
    if quiet_for is None or quiet_for < settings.quiet_window_s:
        so_far = "for an unknown time" if quiet_for is None else f"for {seconds(quiet_for)}"
        return ScaleDecision(dep.name, current, current, f"{status} {so_far} of a {seconds(settings.quiet_window_s)} "
                             f"quiet window: stays at {current}")
    if cooling:
        return ScaleDecision(dep.name, current, current, f"{status}, but {cooldown_note}: stays at {current}")
    return ScaleDecision(dep.name, current, current - 1, f"{status} for {seconds(quiet_for)} (quiet window "
                         f"{seconds(settings.quiet_window_s)}): {current} -> {current - 1} replicas")
