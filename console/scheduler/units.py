"""What is being planned: one Demand per deployment, one Unit per wanted or existing replica, in priority classes.

Classes, most important first (the control loop of the priority-scheduling seed):
  0-3  min   replicas up to each deployment's minimum, critical..batch
  4-7  slo   replicas above the minimum of deployments violating their SLO, critical..batch
  8    extra other wanted replicas of non-batch tiers, by tier-weighted traffic
  9    extra batch replicas above their minimum: the leftovers
Requests waiting at the gateway (demand.py) lift one replica above the minimum of a deployment with none ready
into classes 4-7 (phase "demand"); the replicas of an idle deployment (scaled to zero) are in no class that is
placed (phase "idle").
"""

from __future__ import annotations

from collections.abc import Iterable

from console.scheduler.explain import slo_text, waiting_requests
from console.scheduler.ledger import selector_key
from console.scheduler.scaling import idle_cause
from console.scheduler.sharing import mps_weight
from console.scheduler.types import TIER_RANK, Deployment, Replica, ScaleDecision, host_of

# How much one request per second of each tier weighs when replicas compete for room in time.
TIER_WEIGHT = {"critical": 8.0, "high": 4.0, "standard": 2.0, "batch": 1.0}
EXTRA_CLASS, BATCH_CLASS, IDLE_CLASS = 8, 9, 10


class Demand:
    """One deployment as the planner sees it: resolved counts, per-GPU share, tier, value of a replica."""

    __slots__ = ("dep", "name", "tier", "rank", "width", "share", "low", "target", "violating", "key", "value",
                 "ready", "lc", "profile", "sleep_bytes", "mps_weight", "waiting", "idle", "units")

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
        self.key = selector_key(dep.selector)
        # Tier-weighted recent traffic of one replica: what keeping it ready is worth.
        self.value = TIER_WEIGHT[dep.priority] * dep.traffic_rps / max(decision.target, 1)
        self.ready = 0  # its replicas ready in the plan so far
        self.lc = dep.latency_critical
        self.profile = dep.profile
        self.sleep_bytes = dep.bytes if dep.sleep_bytes is None else dep.sleep_bytes
        self.mps_weight = mps_weight(self.tier, self.lc)  # its claim on a shared GPU's SMs
        self.waiting = dep.demand  # requests queued at the gateway for it
        # Why it is scaled to zero this pass ("" when it is not idle).
        self.idle = "" if now is None or dep.idle_timeout_s is None else idle_cause(dep, now)
        self.units: list[Unit] | None = None  # its wanted units, kept only while requests wait for it

    @property
    def status(self) -> str:
        """How it stands against its SLO, in words."""
        return slo_text(self.dep.slo_latency_ms, self.dep.observed_latency_ms, self.violating)

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
            return waiting_requests(self.waiting)
        return f"{self.dep.traffic_rps:g} req/s"


class Unit:
    """One replica during planning: its demand, priority class, and where it is (GPU numbers in the ledger).

    Attributes that most units never change are class-level defaults: 10,000 units per plan stay cheap.
    """

    phase = "min"  # "min" | "slo" | "extra" | "demand" | "idle"
    klass = 0
    gpus: tuple[int, ...] = ()  # ready placement, ledger numbers
    fixed = False  # still where it was before this pass
    state = "pending"  # pending | ready | stopped (its final state is decided in outcome.py)
    reason = ""
    origin: tuple[str, ...] = ()  # the GPUs it was ready on before this pass
    cause = ""  # why it lost its place in this pass (displaced, preempted, put to sleep)
    cause_kind = ""  # "" | "displaced" | "preempt" | "sleep"
    moved_by = ""  # for a repair move: whom it made room for
    evictor: Unit | None = None  # who preempted it or put it to sleep
    relocated = False  # a kept replica taken off its GPUs during the pass (moved, preempted, put to sleep)
    mps: tuple[int, str] | None = None  # (MPS percentage, why) when it shares a GPU

    def __init__(self, demand: Demand, index: int, existing: Replica | None) -> None:
        self.demand = demand
        self.index = index
        self.existing = existing
        self.share = demand.share
        if existing is not None:
            if existing.reserved_bytes > demand.share * demand.width:
                # An existing reservation is never shrunk by a smaller estimate.
                self.share = -(-existing.reserved_bytes // demand.width)
            if existing.state == "ready":
                self.origin = existing.gpus

    @property
    def label(self) -> str:
        return f"{self.demand.name}#{self.index}"

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
    now: float | None = None,
) -> tuple[dict[str, Demand], list[Unit], list[Unit], list[Replica]]:
    """(demands, wanted units by deployment and index, existing units to retire, orphaned replicas).

    `now` (the pass's time) decides which deployments are idle; None: none is.
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
        rows.sort(key=_index)
        used = {r.index for r in rows}
        if len(used) < len(rows):  # a duplicate (deployment, index): the first one counts
            seen: set[int] = set()
            rows = [r for r in rows if not (r.index in seen or seen.add(r.index))]  # type: ignore[func-returns-value]
        # Ready replicas are kept before sleeping ones; a "ready" row without GPUs was never placed: it is new.
        ready = [r for r in rows if r.state == "ready" and r.gpus]
        existing = ready if len(ready) == len(rows) else ready + [r for r in rows if r.state == "sleeping"]
        target = demand.target
        units = [Unit(demand, r.index, r) for r in existing[:target]]
        if len(units) < target:
            index = 0
            while len(units) < target:
                while index in used:
                    index += 1
                units.append(Unit(demand, index, None))
                index += 1
            units.sort(key=_index)
        elif len(ready) < len(existing):
            units.sort(key=_index)
        # The lowest indices are the minimum, so a replica keeps its class from one pass to the next.
        if demand.waiting:
            demand.units = units
        low, rank = demand.low, demand.rank
        if demand.idle:  # scaled to zero: none of its replicas is placed; the ready ones leave their GPUs
            cause = f"{demand.idle}: scaled to zero"
            for unit in units:
                unit.phase, unit.klass = "idle", IDLE_CLASS
                if unit.origin:
                    unit.cause, unit.cause_kind = cause, "idle"
            wanted.extend(units)
            retired.extend(Unit(demand, r.index, r) for r in existing[target:])
            continue
        rest_phase = demand.rest_phase
        if rest_phase == "slo":
            rest_class = 4 + rank
        else:
            rest_class = BATCH_CLASS if demand.tier == "batch" else EXTRA_CLASS
        for position, unit in enumerate(units):
            if position < low:
                unit.klass = rank  # phase "min" is the class default
            else:
                unit.phase, unit.klass = rest_phase, rest_class
        wanted.extend(units)
        retired.extend(Unit(demand, r.index, r) for r in existing[target:])
    orphans = [r for rows in by_dep.values() for r in rows]
    return demands, wanted, retired, orphans


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
