"""From planned units to the Plan: actions, target states, sleep-or-stop fates, MPS percentages, reasons."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from console.scheduler import explain
from console.scheduler.demand import demand_outcomes
from console.scheduler.gangs import gang_shortfall
from console.scheduler.sharing import assign_mps
from console.scheduler.types import Move, Plan, PlannedReplica, Unplaced
from console.scheduler.units import BATCH_CLASS, Unit

if TYPE_CHECKING:
    from console.scheduler.planner import Run


def assemble(run: Run, elapsed_ms: float) -> Plan:
    """The Plan of a finished run."""
    ledger = run.ledger
    for u in run.wanted:  # a woken replica's pinned host RAM comes free for others to sleep in
        if u.state == "ready" and u.existing is not None and u.existing.state == "sleeping" \
                and run.ram.get(u.home) is not None:
            run.ram[u.home] += u.demand.sleep_bytes
    fates = {}
    losers = [u for u in run.wanted if u.state != "ready" and u.origin]
    for u in sorted(losers, key=lambda u: (u.klass, -u.demand.value, u.demand.name, u.index)):
        fates[id(u)] = _fate(run, u)
    assign_mps(ledger)
    outcomes = demand_outcomes(run, run.demanded) if run.demanded else {}
    refusals: dict[tuple, str] = {}
    replicas: list[PlannedReplica] = []
    moves: list[Move] = []
    unplaced: list[Unplaced] = []
    host = ledger.host
    for u in run.wanted:
        if u.state == "ready":
            if u.fixed and not u.relocated:  # most of a re-plan: unchanged; built here in few steps
                where = u.origin[0] if len(u.origin) == 1 else ", ".join(u.origin)
                if u.mps is None:
                    reason, pct = f"kept on {where}: it still fits", None
                else:
                    reason, pct = f"kept on {where}: it still fits; {u.mps[1]}", u.mps[0]
                replicas.append(PlannedReplica(u.demand.name, u.index, u.origin, host[u.gpus[0]], "ready", "keep",
                                               u.share * u.demand.width, pct, reason))
            else:
                replicas.append(_ready(run, u, moves))
            continue
        alike = (u.demand.name, u.share, u.phase)
        refusal = refusals.get(alike)
        if refusal is None:
            if u.phase == "demand":
                refusal = outcomes[u.demand.name].reason
            elif u.phase == "idle":
                refusal = f"{u.demand.idle}: scaled to zero"
            else:
                refusal = _refusal(run, u)
            refusals[alike] = refusal
        planned = _not_ready(u, refusal, fates.get(id(u)))
        replicas.append(planned)
        unplaced.append(Unplaced(u.demand.name, u.index, planned.reason))
    for u in run.retired:
        decision = run.decisions[u.demand.name]
        replicas.append(PlannedReplica(u.demand.name, u.index, (), None, "stopped", "stop", 0, None,
                                       f"stopped: scaled down to {decision.target} ({decision.reason})",
                                       u.existing.gpus if u.existing else ()))
    for r in run.orphans:
        replicas.append(PlannedReplica(r.deployment, r.index, (), None, "stopped", "stop", 0, None,
                                       "stopped: its deployment no longer exists", r.gpus))
    replicas.sort(key=attrgetter("deployment", "index"))
    scale = tuple(sorted(run.decisions.values(), key=attrgetter("deployment")))
    used, total = 0, 0
    for g, holders in enumerate(ledger.holders):
        if holders:
            gpu = ledger.gpus[g]
            used += min(gpu.total_bytes, gpu.used_bytes + ledger.reserved[g])
            total += gpu.total_bytes
    return Plan(
        strategy=run.placer.name,
        replicas=tuple(replicas),
        moves=tuple(moves),
        unplaced=tuple(unplaced),
        scale=scale,
        gpus_used=sum(1 for h in ledger.holders if h),
        memory_utilization=round(used / total, 4) if total else 0.0,
        elapsed_ms=round(elapsed_ms, 3),
        search=run.search,
        demands=tuple(outcomes.values()),
        gpu_state=(tuple(ledger.gpus), tuple(ledger.reserved), ledger.buffer),
    )


def _prefix(u: Unit) -> str:
    if u.phase == "slo":
        return f"added for the SLO ({u.demand.status}): "
    if u.klass == BATCH_CLASS:
        return "batch leftovers: "
    if u.phase == "demand":
        return f"{explain.waiting_requests(u.demand.waiting)}: "
    return ""


def _ready(run: Run, u: Unit, moves: list[Move]) -> PlannedReplica:
    ledger = run.ledger
    gpus = u.gpus
    ids = (ledger.ids[gpus[0]],) if len(gpus) == 1 else tuple(ledger.ids[g] for g in gpus)
    from_gpus: tuple[str, ...] = ()
    if u.origin and ids == u.origin:  # displaced or evicted in this pass, then back where it was
        action, reason = "keep", f"kept on {', '.join(ids)}: it still fits"
    elif u.origin:
        action, from_gpus = "move", u.origin
        cause = u.cause or u.moved_by
        reason = f"moved from {explain.gpu_list(u.origin)}: {cause}; {u.reason}"
        moves.append(Move(u.demand.name, u.index, u.origin, ids, reason))
    elif u.asleep:
        action = "wake"
        host = ledger.host[gpus[0]]
        where = f"from {u.home} RAM" if host == u.home else f"on another host ({u.home} has no room): loads from disk"
        if u.phase == "demand":
            where += f" {explain.for_waiting(u.demand.waiting)}"
        reason = f"wakes {where}; {u.reason}"
    elif u.phase == "demand":
        action, reason = "place", f"placed {explain.for_waiting(u.demand.waiting)}: {u.reason}"
    else:
        action, reason = "place", _prefix(u) + u.reason
    if u.mps is not None:
        reason = f"{reason}; {u.mps[1]}"
    return PlannedReplica(u.demand.name, u.index, ids, ledger.host[gpus[0]], "ready", action, u.share * u.width,
                          None if u.mps is None else u.mps[0], reason, from_gpus)


def _fate(run: Run, u: Unit) -> tuple[str, str | None, str]:
    """Sleep in its host's RAM when the host reports room for it, else stop: (state, host, words)."""
    host, need = u.home, u.demand.sleep_bytes
    if host not in run.ledger.host_gpus:
        return "stopped", None, f"stopped: host {host} is gone"
    ram = run.ram.get(host)
    if ram is None:
        return "stopped", None, f"stopped: {host} reports no host RAM for sleeping replicas"
    if ram < need:
        return "stopped", None, f"stopped: {host} has {explain.gib(ram)} host RAM free, {explain.gib(need)} needed"
    run.ram[host] = ram - need
    return "sleeping", host, f"drained, then sleeping in {host} RAM ({explain.gib(need)})"


def _not_ready(u: Unit, refusal: str, fate: tuple[str, str | None, str] | None) -> PlannedReplica:
    name, index = u.demand.name, u.index
    if fate is not None:  # it ran on a GPU before this pass
        state, host, words = fate
        if u.cause_kind == "preempt":
            action = "preempt"
        else:
            action = "sleep" if state == "sleeping" else "stop"
        reason = f"{u.cause}; {words}"
        if u.cause_kind == "displaced":
            reason += f"; no room elsewhere: {refusal}"
        by = u.evictor.label if u.evictor is not None else None
        return PlannedReplica(name, index, (), host, state, action, 0, None, reason, u.origin, by)
    if u.asleep:
        more = "; a request wakes it" if u.phase == "idle" else ""
        return PlannedReplica(name, index, (), u.home, "sleeping", "keep", 0, None,
                              f"stays asleep in {u.home} RAM: {refusal}{more}")
    if u.phase == "idle":
        return PlannedReplica(name, index, (), None, "stopped", "refuse", 0, None, f"{refusal}; a request places it")
    reason = _prefix(u) + refusal
    if u.cause:
        reason += f" (it had a place in this pass: {u.cause})"
    return PlannedReplica(name, index, (), None, "stopped", "refuse", 0, None, reason)


def _refusal(run: Run, u: Unit) -> str:
    """Why `u` fits nowhere, measured on the final ledger."""
    ledger = run.ledger
    eligible = ledger.eligible(u.demand.key)
    excluded = len(ledger) - len(eligible)
    neighbours = 0
    if run.placer.name == "latency-sensitive" and u.width == 1:
        neighbours = sum(1 for g in eligible if ledger.free(g) >= u.share and not run.placer.allows(u, g))
    text = explain.refusal(u.share, u.width, ledger.largest_free(eligible), excluded, u.demand.dep.selector,
                           neighbours, gang_shortfall(run.placer, u) if u.width > 1 and eligible else "")
    if u.phase in ("min", "slo") and run.settings.preempt and any(
            d.ready and d.rank > u.demand.rank for d in run.demands.values()):
        text += "; preempting lower tiers would not make room on any GPU"
    return text
