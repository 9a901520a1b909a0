"""From planned units to the Plan: actions, target states, sleep-or-stop fates, MPS percentages, reasons."""

from __future__ import annotations

from operator import attrgetter, lt
from typing import TYPE_CHECKING

from console.scheduler import explain
from console.scheduler.demand import blocked_outlooks, demand_outcomes, why_not_added
from console.scheduler.gangs import gang_shortfall
from console.scheduler.sharing import MIN_MPS, mps_of, mps_text, weight_totals
from console.scheduler.types import Move, Plan, PlannedReplica, Replica, Unplaced, host_of
from console.scheduler.units import BATCH_CLASS, Unit

if TYPE_CHECKING:
    from console.scheduler.run import Run

STALE_WORDS = ("host {host}'s readings are stale (it is unknown, or has not reported since this scheduler began "
               "leading): nothing is placed on it or taken from it until it reports")


def assemble(run: Run, elapsed_ms: float) -> Plan:
    """The Plan of a finished run."""
    ledger = run.ledger
    ram = dict(run.ram)  # host RAM free for sleeping replicas, as the fates below take it
    losers = []
    for u in run.wanted:
        if u.state != "ready":
            if u.origin:
                losers.append(u)
        elif not u.fixed and u.asleep and ram.get(u.home) is not None:
            ram[u.home] += u.demand.sleep_bytes  # a woken replica's pinned host RAM comes free for others
    fates = {}
    for u in sorted(losers, key=lambda u: (u.klass, -u.demand.value, u.demand.name, u.index)):
        fates[id(u)] = _fate(run, u, ram)
    totals = weight_totals(ledger)
    outcomes = demand_outcomes(run, run.demanded) if run.demanded else {}
    refusals: dict[tuple, str] = {}
    replicas: list[PlannedReplica] = []
    moves: list[Move] = []
    unplaced: list[Unplaced] = []
    host, ids, holders = ledger.host, ledger.ids, ledger.holders
    for d in run.demands.values():  # the units of run.wanted, deployment by deployment
        name, width, weight = d.name, d.width, d.mps_weight
        kind = f"{d.tier}, latency-critical" if d.lc else d.tier
        shares: dict[int, int] = {}  # weight total of a GPU -> this deployment's MPS percentage there
        for u in d.members:
            if u.state != "ready":
                _not_ready_into(run, u, outcomes, refusals, fates, replicas, unplaced)
                continue
            if not u.fixed or u.relocated:
                replicas.append(_ready(run, u, moves, totals))
                continue
            # Kept where it was: most of a re-plan, built here in few steps.
            origin, gpus = u.origin, u.gpus
            g = gpus[0]
            if len(gpus) == 1:
                total = totals[g]
                if total:  # on a shared GPU: sharing.mps_of and mps_text, inline
                    pct = shares.get(total)
                    if pct is None:
                        pct = shares[total] = max(MIN_MPS, round(100 * weight / total))
                    reason = (f"kept on {origin[0]}: it still fits; MPS {pct}% of SMs: weight {weight} ({kind}) of "
                              f"{total} on {ids[g]}, shared by {len(holders[g])} replicas")
                else:
                    pct, reason = None, f"kept on {origin[0]}: it still fits"
            else:
                where = ", ".join(origin)
                mps = mps_of(totals, u)
                if mps is None:
                    pct, reason = None, f"kept on {where}: it still fits"
                else:
                    pct, reason = mps[0], f"kept on {where}: it still fits; {mps_text(ledger, totals, u, *mps)}"
            planned = _new(PlannedReplica)  # PlannedReplica(...), its dict built at once
            _set(planned, "__dict__", {
                "deployment": name, "index": u.index, "gpus": origin, "host": host[g], "state": "ready",
                "action": "keep", "reserved_bytes": u.share * width, "mps_percentage": pct, "reason": reason,
                "from_gpus": (), "preempted_by": None})
            replicas.append(planned)
    held = [r for d in run.demands.values() for r in d.held]
    replicas.extend(_held(r) for r in held)
    for u in run.retired:
        decision = run.decisions[u.demand.name]
        replicas.append(PlannedReplica(u.demand.name, u.index, (), None, "stopped", "stop", 0, None,
                                       f"stopped: scaled down to {decision.target} ({decision.reason})",
                                       u.existing.gpus if u.existing else ()))
    for r in run.orphans:
        replicas.append(PlannedReplica(r.deployment, r.index, (), None, "stopped", "stop", 0, None,
                                       "stopped: its deployment no longer exists", r.gpus))
    if held or run.retired or run.orphans or not _names_in_order(run):
        replicas.sort(key=attrgetter("deployment", "index"))  # else they are in order already (units by index)
    scale = tuple(sorted(run.decisions.values(), key=attrgetter("deployment")))
    used, total, in_use = 0, 0, 0
    for g, holders in enumerate(ledger.holders):
        if holders:
            gpu = ledger.gpus[g]
            used += min(gpu.total_bytes, gpu.used_bytes + ledger.reserved[g])
            total += gpu.total_bytes
            in_use += 1
    return Plan(
        strategy=run.placer.name,
        replicas=tuple(replicas),
        moves=tuple(moves),
        unplaced=tuple(unplaced),
        scale=scale,
        gpus_used=in_use,
        memory_utilization=round(used / total, 4) if total else 0.0,
        elapsed_ms=round(elapsed_ms, 3),
        search=run.search,
        demands=tuple(outcomes.values()),
        outlooks=tuple(blocked_outlooks(run).values()),
        gpu_state=_gpu_state(run, held),
    )


def _held(r: Replica) -> PlannedReplica:
    """A replica on a host whose readings are stale, as it is."""
    if r.state == "sleeping":
        return PlannedReplica(r.deployment, r.index, (), r.host, "sleeping", "keep", 0, None,
                              f"stays asleep in {r.host} RAM: {STALE_WORDS.format(host=r.host)}")
    host = host_of(r.gpus[0])
    return PlannedReplica(r.deployment, r.index, r.gpus, host, "ready", "keep", r.reserved_bytes, r.mps_percentage,
                          f"kept on {', '.join(r.gpus)}: {STALE_WORDS.format(host=host)}")


def _gpu_state(run: Run, held: list[Replica]) -> tuple:
    """(gpus, reserved, buffer) of every GPU, the stale ones with what their held replicas reserve."""
    ledger = run.ledger
    if not run.stale:
        return tuple(ledger.gpus), tuple(ledger.reserved), ledger.buffer
    on = {g.id: 0 for g in run.stale}
    for r in held:
        for g in r.gpus:
            on[g] += r.reserved_bytes // len(r.gpus)
    return (tuple(ledger.gpus) + run.stale, tuple(ledger.reserved) + tuple(on[g.id] for g in run.stale),
            ledger.buffer)


_new, _set = object.__new__, object.__setattr__


def _not_ready_into(run: Run, u: Unit, outcomes: dict, refusals: dict[tuple, str], fates: dict,
                    replicas: list[PlannedReplica], unplaced: list[Unplaced]) -> None:
    """The decision for a wanted replica that is not ready: refused, asleep, stopped, preempted; its refusal is
    worked out once for replicas alike."""
    alike = (u.demand.name, u.share, u.phase)
    refusal = refusals.get(alike)
    if refusal is None:
        if u.phase == "demand":
            # A backlog's outcome is "served" by its ready replicas: this replica's own words say why it is not added.
            refusal = why_not_added(run, u) if u.demand.backlog else outcomes[u.demand.name].reason
        elif u.phase == "idle":
            refusal = f"{u.demand.idle}: scaled to zero"
        else:
            refusal = _refusal(run, u)
        refusals[alike] = refusal
    planned = _not_ready(u, refusal, fates.get(id(u)))
    replicas.append(planned)
    unplaced.append(Unplaced(u.demand.name, u.index, planned.reason))


def _names_in_order(run: Run) -> bool:
    """Whether the deployments came sorted by name: then the replicas, built deployment by deployment and index by
    index, need no sort."""
    names = list(run.demands)
    return all(map(lt, names, names[1:]))


def _prefix(u: Unit) -> str:
    if u.phase == "slo":
        return f"added for the SLO ({u.demand.status}): "
    if u.klass == BATCH_CLASS:
        return "batch leftovers: "
    if u.phase == "demand":
        d = u.demand
        return f"{explain.backed_up(d.waiting) if d.backlog else explain.waiting_requests(d.waiting)}: "
    return ""


def _ready(run: Run, u: Unit, moves: list[Move], totals: list[int]) -> PlannedReplica:
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
            where += f" {explain.for_demand(u.demand.waiting, u.demand.backlog)}"
        reason = f"wakes {where}; {u.reason}"
    elif u.phase == "demand":
        action, reason = "place", f"placed {explain.for_demand(u.demand.waiting, u.demand.backlog)}: {u.reason}"
    else:
        action, reason = "place", _prefix(u) + u.reason
    mps = mps_of(totals, u)
    if mps is not None:
        reason = f"{reason}; {mps_text(ledger, totals, u, *mps)}"
    return PlannedReplica(u.demand.name, u.index, ids, ledger.host[gpus[0]], "ready", action, u.share * u.width,
                          None if mps is None else mps[0], reason, from_gpus)


def _fate(run: Run, u: Unit, ram_free: dict[str, int | None]) -> tuple[str, str | None, str]:
    """Sleep in its host's RAM when the host reports room for it (taken from `ram_free`), else stop: (state, host,
    words)."""
    host, need = u.home, u.demand.sleep_bytes
    if host not in run.ledger.host_gpus:
        return "stopped", None, f"stopped: host {host} is gone"
    ram = ram_free.get(host)
    if ram is None:
        return "stopped", None, f"stopped: {host} reports no host RAM for sleeping replicas"
    if ram < need:
        return "stopped", None, f"stopped: {host} has {explain.gib(ram)} host RAM free, {explain.gib(need)} needed"
    ram_free[host] = ram - need
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
        by = u.evictor.named_for(u) if u.evictor is not None else None
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


def _lowest_ready_rank(run: Run) -> int:
    """The rank of the least important tier with a replica ready in the plan (-1: none), worked out once."""
    return run.once("lowest ready rank",
                    lambda: max((d.rank for d in run.demands.values() if d.ready), default=-1))


def _refusal(run: Run, u: Unit) -> str:
    """Why `u` fits nowhere, measured on the final ledger."""
    ledger = run.ledger
    eligible = ledger.eligible(u.demand.key)
    by_label, by_taint = ledger.exclusions(u.demand.key) if len(eligible) < len(ledger) else (0, {})
    text = explain.refusal(u.share, u.width, ledger.largest_free(eligible), by_label, u.demand.dep.selector,
                           gang_shortfall(run.placer, u) if u.width > 1 and eligible else "",
                           stale_hosts=len({g.host for g in run.stale}), excluded_by_taint=by_taint,
                           excluded_by_constraints=_excluded(run, u, eligible) if u.width == 1 else "")
    if u.phase in ("min", "slo") and run.settings.preempt and _lowest_ready_rank(run) > u.demand.rank:
        text += "; preempting lower tiers would not make room on any GPU"
    return text


def _excluded(run: Run, u: Unit, eligible: list[int]) -> str:
    """The constraints' clauses for the eligible GPUs with room for one-GPU `u` that they kept it off, each GPU
    blamed on the first constraint (in the pass's order) that forbids it."""
    constraints = [c for c in run.placer.constraints if c.applies(u)]
    if not constraints:
        return ""
    ledger, counts = run.ledger, [0] * len(constraints)
    for g in eligible:
        if ledger.free(g) >= u.share:
            for i, c in enumerate(constraints):
                if c.check(ledger, u, (g,)):
                    counts[i] += 1
                    break
    return "".join(c.excluded(n) for c, n in zip(constraints, counts, strict=True) if n)
