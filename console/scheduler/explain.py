"""Reason texts: every placement, move, preemption, sleep, stop and refusal says why, in words a person can act on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

GiB = 1024**3


def gib(n: int) -> str:
    """Bytes as GiB with two decimals ("30.20 GiB"), or MiB with one below 1 GiB ("512.0 MiB"), so a
    small model does not read as needing nothing."""
    if abs(n) < GiB:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / GiB:.2f} GiB"


def gpu_list(ids: Iterable[str]) -> str:
    """GPU ids joined for a sentence."""
    return ", ".join(ids)


def selector_text(selector: Mapping[str, str]) -> str:
    """A selector as the labels it requires ("gpu=a100,zone=b")."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def seconds(s: float) -> str:
    """A duration rounded for people ("45 s", "12 min", "2.5 h")."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def short_seconds(s: float) -> str:
    """A duration that may be short, to a tenth of a second below 10 s ("0.4 s", "4 s", "5 min")."""
    if s < 10:
        return f"{max(s, 0.0):.1f}".rstrip("0").rstrip(".") + " s"
    return seconds(s)


def waiting_requests(n: int) -> str:
    """Requests queued at the gateway ("1 request waiting", "3 requests waiting")."""
    return f"{n} request{'s' if n != 1 else ''} waiting"


def for_waiting(n: int) -> str:
    """What a replica is placed or woken for ("for 3 waiting requests")."""
    return f"for {n} waiting request{'s' if n != 1 else ''}"


def backed_up(n: int) -> str:
    """Requests backed up behind ready replicas ("12 requests backed up at the gateway")."""
    return f"{n} request{'s' if n != 1 else ''} backed up at the gateway"


def for_demand(n: int, backlog: bool) -> str:
    """What a replica is placed or woken for: waiting requests, or a backlog behind ready replicas."""
    return f"for {backed_up(n)}" if backlog else for_waiting(n)


def slo_text(slo_ms: float | None, observed_ms: float | None, violating: bool) -> str:
    """How a deployment stands against its SLO ("violating its 200 ms p95 SLO at 340 ms")."""
    if slo_ms is not None and observed_ms is not None:
        verb = "violating" if violating else "within"
        return f"{verb} its {slo_ms:g} ms p95 SLO at {observed_ms:g} ms"
    if violating:
        return "violating its SLO"
    return "within its SLO" if slo_ms is not None else "no SLO"


def refusal(
    share: int,
    width: int,
    largest: tuple[int, str] | None,
    excluded_by_label: int,
    selector: Mapping[str, str],
    gang_note: str = "",
    stale_hosts: int = 0,
    excluded_by_taint: Mapping[str, int] | None = None,
    excluded_by_constraints: str = "",
) -> str:
    """Why a replica fits nowhere: its need, the best room there is, and what was excluded (by the placement
    constraints: their clauses, constraints.Constraint.excluded)."""
    if width == 1:
        need = f"needs {gib(share)}"
    else:
        need = f"needs {width} GPUs with {gib(share)} free each on one host"
    if largest is None:
        quiet = " (no agent connected)" if not stale_hosts else ""
        text = f"{need}; no GPU is available" + (quiet if not excluded_by_label and not excluded_by_taint else "")
    else:
        text = f"{need}; the largest free space is {gib(max(largest[0], 0))} on {largest[1]}"
    if gang_note:
        text += f"; {gang_note}"
    if stale_hosts:
        hosts = "host" if stale_hosts == 1 else "hosts"
        text += (f"; {stale_hosts} {hosts} not counted: their readings are stale until their agents report (unknown, "
                 "or not heard from since this scheduler began leading)")
    if excluded_by_label:
        plural = "GPU" if excluded_by_label == 1 else "GPUs"
        text += f"; {excluded_by_label} {plural} excluded by label {selector_text(selector)}"
    return text + taint_text(excluded_by_taint) + excluded_by_constraints


def excluded_by_spread(count: int) -> str:
    """"; 2 GPUs with room excluded: each holds a replica of it already (spread required)"."""
    return f"; {count} {'GPU' if count == 1 else 'GPUs'} with room excluded: each holds a replica of it already " \
           "(spread required)"


def excluded_by_neighbours(count: int) -> str:
    """"; 2 GPUs with room excluded: they hold latency-critical or non-complementary replicas"."""
    return f"; {count} {'GPU' if count == 1 else 'GPUs'} with room excluded: they hold latency-critical or " \
           "non-complementary replicas"


def taint_text(excluded: Mapping[str, int] | None) -> str:
    """"; 2 GPUs excluded by taint pool=ml (not tolerated)" for each taint that kept a replica off GPUs."""
    return "".join(f"; {n} GPU{'s' if n != 1 else ''} excluded by taint {taint} (not tolerated)"
                   for taint, n in sorted((excluded or {}).items()))


def placed(strategy_note: str, share: int, width: int, gpus: list[str], free_before: list[int]) -> str:
    """Where a new replica goes and what is left there."""
    if width == 1:
        return (f"{strategy_note}: needs {gib(share)}; {gpus[0]} had {gib(free_before[0])} free, "
                f"{gib(free_before[0] - share)} left after")
    left = min(free_before) - share
    return (f"{strategy_note}: needs {width} GPUs with {gib(share)} each on one host; {gpu_list(gpus)} "
            f"(at least {gib(left)} left after on each)")


def preempted_by(label: str, tier: str, why: str) -> str:
    """Who took a replica's room (its label, or how another team's is named), and why that one outranks it."""
    return f"preempted by {label} ({tier}, {why})"
