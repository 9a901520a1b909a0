"""What is being planned: one Demand per deployment, one Unit per wanted or existing replica, in priority classes.

Classes, most important first (the control loop of the priority-scheduling seed):
  0-3  min   replicas up to each deployment's minimum, critical..batch
  4-7  slo   replicas above the minimum of deployments violating their SLO, critical..batch
  8    extra other wanted replicas of non-batch tiers, by tier-weighted traffic
  9    extra batch replicas above their minimum: the leftovers
Requests waiting at the gateway (demand.py) lift one replica above the minimum of a deployment with none ready, or
one that is not ready of a deployment with requests backed up behind its ready ones, into classes 4-7 (phase
"demand"); the replicas of an idle deployment (scaled to zero) are in no class that is
placed (phase "idle").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from console.scheduler.explain import backed_up, slo_text, waiting_requests
from console.scheduler.ledger import selector_key
from console.scheduler.scaling import backlogged, idle_cause
from console.scheduler.sharing import mps_weight
from console.scheduler.types import TIER_RANK, Deployment, Replica, ScaleDecision, host_of

if TYPE_CHECKING:
    from console.scheduler.ledger import Ledger

# How much one request per second of each tier weighs when replicas compete for room in time.
TIER_WEIGHT = {"critical": 8.0, "high": 4.0, "standard": 2.0, "batch": 1.0}
EXTRA_CLASS, BATCH_CLASS, IDLE_CLASS = 8, 9, 10
OTHER_TEAM_REPLICA = "a replica of another team"  # how reasons name a replica of another team's deployment


class Demand:
    """One deployment as the planner sees it: resolved counts, per-GPU share, tier, value of a replica."""

    __slots__ = ("dep", "name", "tier", "rank", "width", "share", "low", "target", "violating", "key", "value",
                 "ready", "lc", "profile", "sleep_bytes", "mps_weight", "waiting", "backlog", "idle", "units",
                 "members", "held")

    def __init__(self, dep: Deployment, decision: ScaleDecision, now: float | None = None) -> None:
        self.dep = dep
        self.name = dep.name
        self.tier = dep.priority
        self.rank = TIER_RANK[dep.priority]
        self.width = dep.gpus_per_replica
        self.share = -(-dep.bytes // dep.gpus_per_replica)  # integer ceiling: bytes are exact
        self.low = min(dep.low, decision.target)
        self.target = decision.target
        self.violating = dep.is_violating
        self.key = selector_key(dep.selector, dep.tolerations)
        # Tier-weighted recent traffic of one replica: what keeping it ready is worth.
        self.value = TIER_WEIGHT[dep.priority] * dep.traffic_rps / max(decision.target, 1)
        self.ready = 0  # its replicas ready in the plan so far
        self.lc = dep.latency_critical
        self.profile = dep.profile
        self.sleep_bytes = dep.bytes if dep.sleep_bytes is None else dep.sleep_bytes
        self.mps_weight = mps_weight(self.tier, self.lc)  # its claim on a shared GPU's SMs
        self.waiting = dep.demand  # requests queued at the gateway for it
        self.backlog = backlogged(dep)  # they are backed up behind its ready replicas: it gets one more
        # Why it is scaled to zero this pass ("" when it is not idle).
        self.idle = "" if now is None or dep.idle_timeout_s is None else idle_cause(dep, now)
        self.units: list[Unit] | None = None  # its wanted units, kept only while requests wait for it
        self.members: list[Unit] = []  # its wanted units, by index (build_units)
        self.held: list[Replica] = []  # its replicas on hosts whose readings are stale: kept as they are, no units

    @property
    def status(self) -> str:
        """How it stands against its SLO, in words."""
        return slo_text(self.dep.slo_latency_ms, self.dep.observed_latency_ms, self.violating)

    @property
    def units_low(self) -> int:
        """How many of its units are in its minimum classes: its minimum less its held replicas."""
        return max(self.low - len(self.held), 0)

    @property
    def rest_phase(self) -> str:
        """The phase of its replicas above the minimum: "slo" while a non-batch tier violates its SLO, else
        "extra". A replica lifted into phase "demand" has this phase again in the next pass, once one is ready."""
        return "slo" if self.violating and self.tier != "batch" else "extra"

    def why(self, phase: str) -> str:
        """Why a replica of this deployment in `phase` outranks lower tiers (for preemption reasons)."""
        if phase == "min":
            return f"needs its minimum of {self.low} replica{'s' if self.low != 1 else ''}"
        if phase == "slo":
            return self.status
        if phase == "demand":
            return backed_up(self.waiting) if self.backlog else waiting_requests(self.waiting)
        return f"{self.dep.traffic_rps:g} req/s"


class Unit:
    """One replica during planning: its demand, priority class, and where it is (GPU numbers in the ledger).

    Slots: a plan builds 10,000 of them, and reads their attributes in every loop.
    """

    __slots__ = ("demand", "index", "existing", "share", "phase", "klass", "gpus", "fixed", "state", "reason",
                 "origin", "cause", "cause_kind", "moved_by", "evictor", "relocated")

    def __init__(self, demand: Demand, index: int, existing: Replica | None) -> None:
        self.demand = demand
        self.index = index
        self.existing = existing
        self.share = demand.share
        self.phase = "min"  # "min" | "slo" | "extra" | "demand" | "idle"
        self.klass = 0
        self.gpus: tuple[int, ...] = ()  # ready placement, ledger numbers
        self.fixed = False  # still where it was before this pass
        self.state = "pending"  # pending | ready | stopped (its final state is decided in outcome.py)
        self.reason = ""
        self.origin: tuple[str, ...] = ()  # the GPUs it was ready on before this pass
        self.cause = ""  # why it lost its place in this pass (displaced, preempted, put to sleep)
        self.cause_kind = ""  # "" | "displaced" | "preempt" | "sleep"
        self.moved_by = ""  # for a repair move: whom it made room for
        self.evictor: Unit | None = None  # who preempted it or put it to sleep
        self.relocated = False  # a kept replica taken off its GPUs during the pass (moved, preempted, put to sleep)
        if existing is not None:
            if existing.reserved_bytes > demand.share * demand.width:
                # An existing reservation is never shrunk by a smaller estimate.
                self.share = -(-existing.reserved_bytes // demand.width)
            if existing.state == "ready":
                self.origin = existing.gpus

    @property
    def label(self) -> str:
        return f"{self.demand.name}#{self.index}"

    def named_for(self, reader: Unit) -> str:
        """This replica as a reason written for `reader` names it: its label within one team, else unnamed, so that
        no team learns another's deployments from the scheduler's words (console/accounts/scope.py)."""
        return self.label if self.demand.dep.team == reader.demand.dep.team else OTHER_TEAM_REPLICA

    @property
    def home(self) -> str | None:
        """The host of an existing replica: where a sleeping one's weights are."""
        e = self.existing
        return None if e is None else (e.host or (host_of(e.gpus[0]) if e.gpus else None))

    @property
    def width(self) -> int:
        return self.demand.width

    @property
    def asleep(self) -> bool:
        """An existing replica whose weights are in host RAM now."""
        return self.existing is not None and self.existing.state == "sleeping"


def _index(item: Replica | Unit) -> int:
    return item.index


def build_units(
    deployments: Iterable[Deployment], decisions: dict[str, ScaleDecision], replicas: Iterable[Replica],
    now: float | None = None, ledger: Ledger | None = None, stale_hosts: frozenset[str] = frozenset(),
) -> tuple[dict[str, Demand], list[Unit], list[Unit], list[Replica]]:
    """(demands, wanted units by deployment and index, existing units to retire, orphaned replicas).

    `now` (the pass's time) decides which deployments are idle; None: none is. With `ledger` (empty), the
    existing replicas that most plainly stay are reserved as they are built (see _existing_units). Replicas on
    `stale_hosts` are held (Demand.held): they count towards their deployment's replicas and minimum, keep their
    indices, and are never units, so nothing can move, stop, preempt, wake or retire them.
    """
    demands = {d.name: Demand(d, decisions[d.name], now) for d in deployments}
    by_dep: dict[str, list[Replica]] = {}
    for r in replicas:
        rows = by_dep.get(r.deployment)
        if rows is None:
            by_dep[r.deployment] = [r]
        else:
            rows.append(r)
    wanted: list[Unit] = []
    retired: list[Unit] = []
    for name, demand in demands.items():
        rows = by_dep.pop(name, None) or []
        if len(rows) > 1:
            rows.sort(key=_index)
            if len({r.index for r in rows}) < len(rows):  # a duplicate (deployment, index): the first one counts
                seen: set[int] = set()
                rows = [r for r in rows if not (r.index in seen or seen.add(r.index))]  # type: ignore[func-returns-value]
        used_rows = rows
        if stale_hosts and rows:
            held = [r for r in rows if _host_of_replica(r) in stale_hosts]
            if held:
                rows = [r for r in rows if _host_of_replica(r) not in stale_hosts]
                demand.held = held
                # Held ready replicas count as ready (requests for the deployment are not lifted elsewhere for
                # them), and towards its minimum: the units take the rest of the minimum classes.
                demand.ready = sum(1 for r in held if r.state == "ready")
        # Ready replicas are kept before sleeping ones; a "ready" row without GPUs was never placed: it is new.
        ready = [r for r in rows if r.gpus and r.state == "ready"]
        existing = ready if len(ready) == len(rows) else ready + [r for r in rows if r.state == "sleeping"]
        target = max(demand.target - len(demand.held), 0)
        units = _existing_units(demand, existing[:target], ledger) if existing else []
        if len(units) < target:
            used = {r.index for r in used_rows}
            index = 0
            while len(units) < target:
                while index in used:
                    index += 1
                units.append(Unit(demand, index, None))
                index += 1
            if rows:
                units.sort(key=_index)
        elif len(ready) < len(existing):
            units.sort(key=_index)
        if len(existing) > target:
            retired.extend(Unit(demand, r.index, r) for r in existing[target:])
        # The lowest indices are the minimum, so a replica keeps its class from one pass to the next.
        if demand.waiting:
            demand.units = units
        demand.members = units
        wanted.extend(units)
        low, rank = demand.units_low, demand.rank
        if demand.idle:  # scaled to zero: none of its replicas is placed; the ready ones leave their GPUs
            cause = f"{demand.idle}: scaled to zero"
            for unit in units:
                unit.phase, unit.klass = "idle", IDLE_CLASS
                if unit.origin:
                    unit.cause, unit.cause_kind = cause, "idle"
            continue
        # Phase "min" and class 0 are what a unit starts with: only what differs is set.
        if rank:
            for unit in units[:low]:
                unit.klass = rank
        if len(units) > low:
            rest_phase = demand.rest_phase
            if rest_phase == "slo":
                rest_class = 4 + rank
            else:
                rest_class = BATCH_CLASS if demand.tier == "batch" else EXTRA_CLASS
            for unit in units[low:]:
                unit.phase, unit.klass = rest_phase, rest_class
    orphans = [r for rows in by_dep.values() for r in rows]
    return demands, wanted, retired, orphans


def _host_of_replica(r: Replica) -> str | None:
    """Where a replica is: its sleeping host, else its GPUs' host (None: not placed)."""
    return r.host or (host_of(r.gpus[0]) if r.gpus else None)


_new_unit = object.__new__


def _existing_units(demand: Demand, rows: list[Replica], ledger: Ledger | None) -> list[Unit]:
    """`[Unit(demand, r.index, r) for r in rows]` in fewer steps: a re-plan builds one per replica, 10,000 of them.

    With a ledger, a ready replica alone on one GPU that still exists, of a deployment that is not idle and whose
    selector and tolerations exclude no GPU, is reserved there at once (kept): most of a re-plan.
    `run.Run.keep_existing` takes such replicas back from a GPU that can no longer hold everything it held, and keeps or
    displaces all the others.
    """
    share, width = demand.share, demand.width
    whole = share * width
    units = []
    plain = ledger is not None and width == 1 and not demand.idle and not ledger.restricts(demand.key)
    if plain:
        number = ledger.number  # type: ignore[union-attr]
        kept: list[tuple[Unit, int]] = []
    for r in rows:
        u = _new_unit(Unit)  # Unit.__init__, inline
        u.demand, u.index, u.existing = demand, r.index, r
        held = r.reserved_bytes
        # An existing reservation is never shrunk by a smaller estimate.
        u.share = share if held <= whole else -(-held // width)
        u.phase, u.klass, u.reason, u.cause, u.cause_kind, u.moved_by = "min", 0, "", "", "", ""
        u.evictor, u.relocated = None, False
        units.append(u)
        if r.state != "ready":
            u.origin, u.gpus, u.fixed, u.state = (), (), False, "pending"
            continue
        gpus = u.origin = r.gpus
        if plain and len(gpus) == 1:
            g = number.get(gpus[0])
            if g is not None:
                kept.append((u, g))
                u.gpus, u.fixed, u.state = (g,), True, "ready"
                continue
        u.gpus, u.fixed, u.state = (), False, "pending"
    if plain and kept:
        ledger.hold(kept)  # type: ignore[union-attr]
        demand.ready += len(kept)
    return units


def within_residency(unit: Unit, now: float, minimum: float) -> float | None:
    """How long a replica kept where it was before this pass has been on its GPUs (its `ready_since`), when that
    is less than `minimum`; None when it is past its residency or was placed in this pass."""
    if not unit.fixed or unit.relocated:
        return None
    since = unit.existing.ready_since if unit.existing is not None else None
    if since is None:
        return None
    age = now - since
    return age if age < minimum else None
