"""Demand from the inference gateway: requests queued for a deployment with no ready replica, or backed up behind
its ready ones (a backlog: its agents report replicas ready and requests still wait).

1. Marking (after the kept replicas are reserved): a deployment with requests waiting and no replica ready
   lifts its lowest-index replica above its minimum into phase "demand", class 4 + tier rank (with the SLO
   replicas, before extras and batch leftovers). A sleeping replica is preferred: it wakes in place. A backlog
   lifts the same way one of its replicas above the minimum that is not ready: the one more replica its scale
   decision asked for (scaling.py).
2. Eviction, after a plain fit and one move: a victim is of another deployment, above its minimum, kept from
   before this pass and past its minimum residency, and either of a strictly lower tier (preempted, busy or
   not) or of the same tier and idle for `Settings.idle_grace_s` (put to sleep). Higher tiers never are.
   Lower tiers go first, then the least recently used.
3. The outcome, on the final ledger, for each deployment with requests waiting: served (a replica is ready),
   refused (no GPU could ever hold one, or every replica it could displace is of a higher tier or at its
   minimum) or waiting (who must go idle or finish its residency first). A backlog is served (its ready replicas
   serve its requests), and says which replica it adds, which is on its way, or why none can be added.
4. The outlook of a deployment with none ready and no requests waiting: blocked when a request would be refused,
   so that its pages do not promise that a request wakes one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from console.scheduler import explain
from console.scheduler.preemption import Found, evict_for, victims_on
from console.scheduler.types import DemandOutcome
from console.scheduler.units import Demand, Unit, within_residency

if TYPE_CHECKING:
    from console.scheduler.run import Run

NEVER = float("-inf")  # a replica that never had a request was used least recently of all
NAMED = 3  # blockers named in one reason


def to_lift(d: Demand) -> Unit | None:
    """With requests waiting and no replica ready, or backed up behind ready ones, the replica above the minimum
    that is not ready to lift into phase "demand": the lowest index, a sleeping one (it wakes in place) first. Also
    asked when a pass evicts a deployment's last ready replica: the next pass would lift one, so this pass plans it
    as demand too (re-planning moves nothing)."""
    units = d.units
    if units is None or (d.ready and not d.backlog) or any(u.phase == "demand" for u in units):
        return None
    above = [u for u in units[d.units_low:] if u.state != "ready"]
    return next((u for u in above if u.asleep), above[0]) if above else None


def _last_used(v: Unit) -> float:
    e = v.existing
    return NEVER if e is None or e.last_request_at is None else e.last_request_at


def _order(v: Unit) -> tuple:
    """Lower tiers first, then the least recently used, then the largest (fewer victims)."""
    return (-v.demand.rank, _last_used(v), -v.share)


WEIGHT = (512.0, 64.0, 8.0, 1.0)  # critical..batch: a victim of a lower tier weighs an eighth of one above


def _cost(taken: list[Unit]) -> tuple[int, float, float, int, int]:
    """Lower tiers first, then the most recent use among the victims (least recently used first)."""
    weight, latest, size = 0.0, NEVER, 0
    for v in taken:
        weight += WEIGHT[v.demand.rank]
        last = v.existing.last_request_at  # type: ignore[union-attr]
        if last is not None and last > latest:
            latest = last
        size += v.share
    return (0, weight, latest, len(taken), size)


def idle_for(v: Unit, now: float, grace: float) -> float | None:
    """Seconds since `v` last had a request, when it is idle (at least `grace`, or never used: inf); else None."""
    last = _last_used(v)
    if last == NEVER:
        return float("inf")
    return now - last if now - last >= grace else None


def _idle_words(v: Unit, now: float) -> str:
    last = _last_used(v)
    return "never used" if last == NEVER else f"idle for {explain.short_seconds(now - last)}"


def displaceable(unit: Unit, v: Unit) -> bool:
    """Whether `v` could ever give its room to a demand `unit`: another deployment's replica above its minimum,
    of the same or a lower tier (whether it may now depends on its use and residency)."""
    return v.demand is not unit.demand and v.phase != "min" and v.demand.rank >= unit.demand.rank


def _evictable(v: Unit, rank: int, now: float, residency: float, grace: float) -> bool:
    """Whether displaceable `v` may leave its GPUs now for a demand of tier `rank`: kept from before this pass,
    past its minimum residency, and of a lower tier or idle."""
    if not v.fixed or v.relocated:
        return False
    e = v.existing
    if e.ready_since is not None and now - e.ready_since < residency:  # type: ignore[union-attr]
        return False
    if v.demand.rank > rank:
        return True
    last = e.last_request_at  # type: ignore[union-attr]
    return last is None or now - last >= grace


def _shape(unit: Unit) -> tuple:
    """Demand replicas of one shape have the same victims (their own deployment holds none) and the same fate."""
    d = unit.demand
    return (d.rank, unit.share, unit.width, d.key, d.lc, d.profile)


def _blocked(run: Run, unit: Unit, v: Unit) -> str:
    """Why displaceable `v` may not be evicted for `unit` now ("" when it may), in words."""
    now, settings = run.request.now, run.settings
    label = f"{v.named_for(unit)} ({v.demand.tier})"
    if not v.fixed or v.relocated:
        return f"waiting for {label} to finish its {settings.min_residency_s:g} s minimum residency (placed in " \
               "this pass)"
    age = within_residency(v, now, settings.min_residency_s)
    if age is not None:
        return (f"waiting for {label} to finish its {settings.min_residency_s:g} s minimum residency "
                f"(placed or woken {explain.short_seconds(age)} ago)")
    if v.demand.rank == unit.demand.rank and idle_for(v, now, settings.idle_grace_s) is None:
        return (f"waiting for {label} to go idle: busy {explain.short_seconds(now - _last_used(v))} ago "
                f"(grace {settings.idle_grace_s:g} s)")
    return ""


def demand_for(run: Run, unit: Unit) -> bool:
    """Place a demand `unit` by preempting lower tiers or putting idle replicas of its tier to sleep; nothing is
    evicted once its deployment has a replica ready (its minimum may have been placed in this pass), unless its
    requests are backed up behind its ready replicas."""
    d = unit.demand
    if d.ready and not d.backlog:
        return False
    # Placements only take room: a shape that failed fails again until something is released.
    shape = _shape(unit)
    if run.demands_failed.failed(shape):
        return False
    why, rank = d.why("demand"), d.rank
    now, residency, grace = run.request.now, run.settings.min_residency_s, run.settings.idle_grace_s

    def ok(v: Unit) -> bool:
        return (v.demand is not d and v.phase != "min" and v.demand.rank >= rank
                and _evictable(v, rank, now, residency, grace))

    def describe(v: Unit) -> tuple[str, str]:
        if v.demand.rank > d.rank:
            return "preempt", explain.preempted_by(unit.named_for(v), d.tier, why)
        return "sleep", (f"put to sleep for {unit.named_for(v)} ({d.tier}, {why}): "
                         f"{_idle_words(v, run.request.now)}")

    def note(victims: list[Unit]) -> str:
        return "took the room of " + ", ".join(
            f"{v.named_for(unit)} ({'lower tier' if v.demand.rank > d.rank else 'idle'})" for v in victims)

    def single() -> Found | None:
        return _best_single(run, unit, ok)

    if evict_for(run, unit, ok, "sleep", "", order=_order, cost=_cost, describe=describe, note=note, single=single):
        return True
    run.demands_failed.note(shape)
    return False


def _walk_order(v: Unit) -> tuple:
    return (-v.demand.rank, _last_used(v), v.share)


def _candidates(run: Run) -> list[Unit]:
    """Replicas kept from before this pass, above their minimum and past their residency, in victim order: every
    replica demand may ever evict in this pass (built at its first eviction), the smallest first among ties."""
    return run.once("demand victims", lambda: _victims(run))


def _victims(run: Run) -> list[Unit]:
    now, residency = run.request.now, run.settings.min_residency_s
    found = [u for u in run.wanted if u.fixed and u.phase != "min" and u.gpus
             and within_residency(u, now, residency) is None]
    found.sort(key=_walk_order)
    return found


def _best_single(run: Run, unit: Unit, ok) -> Found | None:
    """The cheapest victims for a one-GPU `unit` (what a scan of every GPU finds), looking at GPUs in the order of
    their best victim: a GPU not reached yet costs at least one victim of the tier, last use and size of the
    walk's position, so the walk stops once that reaches the best found (an exact tie goes to the GPU reached
    first)."""
    ledger = run.ledger
    allowed = ledger.eligible_set(unit.demand.key)
    best: Found | None = None
    seen: set[int] = set()
    for v in _candidates(run):
        if not v.gpus or not ok(v):  # evicted already, or not a victim for this unit
            continue
        if best is not None:
            last = v.existing.last_request_at  # type: ignore[union-attr]
            if (0, WEIGHT[v.demand.rank], NEVER if last is None else last, 1, v.share) >= best[0]:
                break
        for g in v.gpus:
            if g in seen or g not in allowed:
                continue
            seen.add(g)
            found = victims_on(run, unit, g, ok, _order, _cost)
            if found and (best is None or (found[0], g) < (best[0], best[1][0])):
                best = (found[0], (g,), found[1])
    return best


# --- outcome ----------------------------------------------------------------------------------------------


def demand_outcomes(run: Run, demanded: list[Demand]) -> dict[str, DemandOutcome]:
    """One outcome per deployment with requests waiting, measured on the final ledger."""
    found: dict[str, DemandOutcome] = {}
    alike: dict[tuple, tuple[str, str]] = {}  # unserved deployments of one shape wait or are refused alike
    for d in sorted(demanded, key=lambda d: d.name):
        units = d.units or []
        if d.backlog:
            found[d.name] = DemandOutcome(d.name, "served", _backlog(run, d))
            continue
        ready = next((u for u in units if u.state == "ready"), None)
        held = next((r for r in d.held if r.state == "ready"), None)
        if ready is not None:
            found[d.name] = DemandOutcome(d.name, "served", _served(run, ready))
        elif held is not None:
            found[d.name] = DemandOutcome(d.name, "served", f"ready on {', '.join(held.gpus)} (held: its host's "
                                                            "readings are stale until it reports)")
        elif d.held and not units:  # asleep on a stale host: woken there once it reports, or moved once evicted
            where = ", ".join(sorted({r.host or "?" for r in d.held}))
            found[d.name] = DemandOutcome(d.name, "waiting", f"its replicas sleep on {where}, whose readings are "
                                                             "stale: it is woken when its host reports again")
        elif not units:
            found[d.name] = DemandOutcome(d.name, "refused", "its max_replicas is 0: no replica may run "
                                                             f"({explain.waiting_requests(d.waiting)})")
        else:
            unit = next((u for u in units if u.phase == "demand"), units[0])
            key = _shape(unit) + (unit.phase,)
            if key not in alike:
                alike[key] = _unserved(run, unit)
            found[d.name] = DemandOutcome(d.name, *alike[key])
    return found


def blocked_outlooks(run: Run) -> dict[str, DemandOutcome]:
    """For each deployment with no replica ready and no requests waiting, whose next request would be refused
    as things stand: status "blocked" and why."""
    found: dict[str, DemandOutcome] = {}
    alike: dict[tuple, tuple[str, str]] = {}
    for d in run.demands.values():
        if d.units is not None or d.ready or not d.members or d.held:
            continue
        unit = next((u for u in d.members if u.asleep), d.members[0])
        key = _shape(unit)
        if key not in alike:
            alike[key] = _unserved(run, unit)
        status, reason = alike[key]
        if status == "refused":
            found[d.name] = DemandOutcome(d.name, "blocked", reason)
    return found


def _unserved(run: Run, unit: Unit) -> tuple[str, str]:
    """Refused or waiting, and why, for a demand replica that is not ready."""
    d = unit.demand
    ledger = run.ledger
    share, width = unit.share, unit.width
    eligible = ledger.eligible(d.key)
    capable = [g for g in eligible if ledger.capacity[g] >= share]
    hosts = _hosts_with(ledger, capable, width)
    need = f"needs {explain.gib(share)}" if width == 1 else \
        f"needs {width} GPUs with {explain.gib(share)} each on one host"
    if not hosts:
        return "refused", f"{need}; {_never(run, d, eligible, capable, width)}"
    capable_set = set(capable)
    fits = [g for h in hosts for g in ledger.host_gpus[h] if g in capable_set]
    room = {g: ledger.free(g) + sum(v.share for v in ledger.holders[g] if displaceable(unit, v)) for g in fits}
    reach = [g for g in fits if room[g] >= share]
    if not _hosts_with(ledger, reach, width):
        g = max(fits, key=lambda g: (room[g], -g))
        stuck = [v for v in ledger.holders[g] if not displaceable(unit, v)]
        return "refused", (f"{need}; every replica it could displace is of a higher tier or at its min_replicas: "
                           f"{ledger.ids[g]} holds {_names([_held(unit, v) for v in stuck])}")
    return "waiting", _waiting(run, unit, reach, need)


def _backlog(run: Run, d: Demand) -> str:
    """For requests backed up behind ready replicas: the replica added for them, the ones on their way, or why none
    is added."""
    n = d.dep.ready_replicas
    behind = f"backed up behind {n} ready replica{'s' if n != 1 else ''}"
    units = d.units or []
    extra = next((u for u in units if u.phase == "demand"), None) or next((u for u in units if u.state != "ready"),
                                                                          None)
    if extra is not None and extra.state == "ready":
        return f"{behind}: adding {extra.label}, {_added(run, extra)}"
    if extra is not None:
        status, why = _unserved(run, extra)
        if status == "refused":
            return f"{behind}, but no replica can be added: {why}"
        return f"{behind}; a replica is added once there is room: {why}"
    coming = d.ready - n  # ready in the plan, not yet at the gateway
    if coming == 1:
        return f"{behind}: 1 more replica is on its way"
    if coming > 1:
        return f"{behind}: {coming} more replicas are on their way"
    high = d.dep.high
    if n >= high:
        return f"{behind}, but it is at its maximum of {high} replica{'s' if high != 1 else ''}"
    return f"{behind}: every replica it asked for is ready in the plan"


def why_not_added(run: Run, unit: Unit) -> str:
    """Why the replica lifted for a backlog is not placed (who must go first, or why it never can be)."""
    return _unserved(run, unit)[1]


def _added(run: Run, u: Unit) -> str:
    """Where a replica added for a backlog goes in this pass ("woken from a RAM onto a/1")."""
    ledger = run.ledger
    where = ", ".join(ledger.ids[g] for g in u.gpus)
    if u.asleep:
        if ledger.host[u.gpus[0]] == u.home:
            return f"woken from {u.home} RAM onto {where}"
        return f"woken on {where} (loads from disk: {u.home} has no room)"
    return f"moved to {where}" if u.origin else f"placed on {where}"


def _served(run: Run, u: Unit) -> str:
    ledger = run.ledger
    where = ", ".join(ledger.ids[g] for g in u.gpus)
    requests = explain.for_waiting(u.demand.waiting)
    if u.fixed and not u.relocated:
        return f"ready on {where}"
    if u.asleep:
        if ledger.host[u.gpus[0]] == u.home:
            return f"woken from {u.home} RAM onto {where} {requests}"
        return f"woken on {where} {requests} (loads from disk: {u.home} has no room)"
    if u.origin:
        return f"moved to {where}"
    return f"placed on {where} {requests}"


def _hosts_with(ledger, gpus: list[int], width: int) -> list[str]:
    """Hosts with at least `width` of `gpus`."""
    count: dict[str, int] = {}
    for g in gpus:
        count[ledger.host[g]] = count.get(ledger.host[g], 0) + 1
    return [h for h, n in count.items() if n >= width]


def _never(run: Run, d: Demand, eligible: list[int], capable: list[int], width: int) -> str:
    """Why no GPU (no host, for a gang) could hold one replica even if no ModelGrid replica were on it."""
    ledger = run.ledger
    excluded = len(ledger) - len(eligible)
    by_label, by_taint = ledger.exclusions(d.key) if excluded else (0, {})
    label = f"; {by_label} GPU{'s' if by_label != 1 else ''} excluded by label " \
            f"{explain.selector_text(d.dep.selector)}" if by_label else ""
    label += explain.taint_text(by_taint)
    if not eligible:
        return ("no GPU matches its selector and tolerations" if excluded
                else "no GPU is available (no agent connected)") + label
    if width == 1 or not capable:
        g = max(eligible, key=lambda g: (ledger.capacity[g], -g))
        what = "GPU" if width == 1 else "GPU of a gang"
        return (f"no {what} can ever hold it: the largest is {explain.gib(max(ledger.capacity[g], 0))} "
                f"({ledger.ids[g]}){label}")
    count: dict[str, int] = {}
    for g in capable:
        count[ledger.host[g]] = count.get(ledger.host[g], 0) + 1
    host = max(count, key=lambda h: count[h])
    return f"no host can ever hold it: the most such GPUs on one host is {count[host]} ({host}){label}"


def _held(unit: Unit, v: Unit) -> str:
    if v.demand is unit.demand:
        return f"{v.label} (its own)"
    return f"{v.named_for(unit)} ({v.demand.tier}{', at its minimum' if v.phase == 'min' else ''})"


def _names(items: list[str]) -> str:
    if len(items) <= NAMED:
        return ", ".join(items)
    return ", ".join(items[:NAMED]) + f" and {len(items) - NAMED} more"


def _waiting(run: Run, unit: Unit, reach: list[int], need: str) -> str:
    """Who must go idle or finish its residency before `unit` can have room, on the GPU that needs the fewest."""
    ledger = run.ledger
    best: list[str] | None = None
    for g in reach:
        pool = sorted((v for v in ledger.holders[g] if displaceable(unit, v)), key=_order)
        freed, blocked = ledger.free(g), []
        for v in pool:
            if freed >= unit.share:
                break
            freed += v.share
            why = _blocked(run, unit, v)
            if why:
                blocked.append(why)
        if blocked and (best is None or len(blocked) < len(best)):
            best = blocked
            if len(best) == 1:
                break
    if best:
        return "; ".join(best[:NAMED]) + (f"; and {len(best) - NAMED} more" if len(best) > NAMED else "")
    if not run.settings.preempt:
        return f"{need}; preemption is off (Settings.preempt), so it waits for free room"
    largest = ledger.largest_free(ledger.eligible(unit.demand.key))
    free = "" if largest is None else f"; the largest free space is {explain.gib(max(largest[0], 0))} on {largest[1]}"
    return f"{need}{free}; the room it could take is not free on one GPU (or host) yet"
