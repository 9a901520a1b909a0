"""The scheduler's vocabulary: frozen inputs (GPUs, hosts, deployments, current replicas) and the plan it returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from console.scheduler.constraints import Constraint

TIERS = ("critical", "high", "standard", "batch")
TIER_RANK = {tier: rank for rank, tier in enumerate(TIERS)}  # 0 is the most important
STRATEGIES = ("fill-first", "balance", "memory-optimized", "latency-sensitive")
SPREADS = ("preferred", "required", "none")
ANY_VALUE = "*"  # a toleration of every value of a taint's key
PROFILES = ("compute", "memory", "io")

Tier = Literal["critical", "high", "standard", "batch"]
Strategy = Literal["fill-first", "balance", "memory-optimized", "latency-sensitive"]
Spread = Literal["preferred", "required", "none"]
State = Literal["ready", "sleeping", "stopped"]
Action = Literal["keep", "place", "move", "wake", "preempt", "sleep", "stop", "refuse"]


def host_of(gpu_id: str) -> str:
    """The host part of a GPU id ("host-b/1" -> "host-b")."""
    return gpu_id.rsplit("/", 1)[0]


@dataclass(frozen=True)
class Gpu:
    """One GPU: its capacity, the memory processes outside ModelGrid use on it, its labels."""

    id: str  # "host/index", stable across plans
    host: str
    total_bytes: int
    used_bytes: int = 0  # foreign use only: never ModelGrid's own reservations
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Only deployments that tolerate every one of these (key -> value) are placed here: a dedicated pool.
    taints: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Its host's readings are stale (unknown, or not heard from since this scheduler began leading): nothing is
    # placed onto it or taken from it; its replicas are held as they are until the host reports again.
    stale: bool = False


@dataclass(frozen=True)
class Host:
    """A host's room for sleeping replicas (weights parked in pinned host RAM)."""

    name: str
    ram_free_bytes: int | None = None  # None: not reported, so nothing is put to sleep there


@dataclass(frozen=True)
class Deployment:
    """What the operator wants served, and what was observed of it."""

    name: str
    bytes: int  # one replica, from the estimator; a gang splits it evenly over its GPUs
    replicas: int = 1  # the current desired count (what the console last decided)
    min_replicas: int | None = None  # None: `replicas`
    max_replicas: int | None = None  # None: `replicas`
    gpus_per_replica: int = 1
    priority: Tier = "standard"
    selector: Mapping[str, str] = field(default_factory=dict, hash=False)  # GPU labels it requires
    tolerations: Mapping[str, str] = field(default_factory=dict, hash=False)  # taints it may go to ("*": any value)
    # Its replicas on different GPUs, then hosts, then zones: "preferred" (unless they cannot), "required" (never
    # two on one GPU) or "none" (where the strategy puts them).
    spread: Spread = "preferred"
    slo_latency_ms: float | None = None  # p95 target
    latency_critical: bool = False
    profile: str | None = None  # "compute" | "memory" | "io" | None (unknown)
    traffic_rps: float = 0.0  # recent requests per second, all replicas together
    observed_latency_ms: float | None = None  # recent p95
    violating: bool | None = None  # None: observed_latency_ms > slo_latency_ms when both are known
    status_since: float | None = None  # when it entered its current SLO status (violating or not)
    last_scale_at: float | None = None  # when its replica count last changed
    sleep_bytes: int | None = None  # host RAM one sleeping replica needs; None: `bytes`
    # Requests waiting at the gateway (0: none). With none of its replicas ready they wait for one; with some ready
    # (`ready_replicas`) they are backed up behind them: it gets one more replica (up to max_replicas).
    demand: int = 0
    ready_replicas: int = 0  # its replicas its agents report ready (what the gateway routes to)
    idle_timeout_s: float | None = None  # with min_replicas 0: no request this long -> off its GPUs; None: never
    demand_since: float | None = None  # when its requests started waiting (the longest-waiting demand goes first)
    active_at: float | None = None  # last request in flight or queued, else its creation; None: unknown (never idle)
    # Its owners' team: a reason written for another team's replica names this one's replicas only as "a replica of
    # another team" (units.Unit.named_for). None: one team (a dry run's deployments, say).
    team: int | None = None

    def __post_init__(self) -> None:
        if self.bytes < 0 or self.gpus_per_replica < 1 or self.replicas < 0:
            raise ValueError(f"deployment {self.name!r}: bytes, replicas and gpus_per_replica must be positive")
        if self.demand < 0 or self.ready_replicas < 0 or (self.idle_timeout_s is not None and self.idle_timeout_s < 0):
            raise ValueError(f"deployment {self.name!r}: demand, ready_replicas and idle_timeout_s must not be "
                             "negative")
        if self.spread not in SPREADS:
            raise ValueError(f"deployment {self.name!r}: spread must be one of {', '.join(SPREADS)}")
        if self.priority not in TIER_RANK:
            raise ValueError(f"deployment {self.name!r}: priority must be one of {', '.join(TIERS)}")
        if self.low > self.high:
            raise ValueError(f"deployment {self.name!r}: min_replicas {self.low} exceeds max_replicas {self.high}")

    @property
    def low(self) -> int:
        """The minimum replica count."""
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def high(self) -> int:
        """The maximum replica count."""
        return self.replicas if self.max_replicas is None else self.max_replicas

    @property
    def is_violating(self) -> bool:
        """Whether it misses its SLO now (explicit flag first, else observed p95 against the target)."""
        if self.violating is not None:
            return self.violating
        if self.slo_latency_ms is None or self.observed_latency_ms is None:
            return False
        return self.observed_latency_ms > self.slo_latency_ms


@dataclass(frozen=True)
class Replica:
    """A replica that exists now: where it is and whether its weights are on the GPU or asleep in host RAM."""

    deployment: str
    index: int
    gpus: tuple[str, ...] = ()
    reserved_bytes: int = 0  # all its GPUs together
    state: Literal["ready", "sleeping"] = "ready"
    host: str | None = None  # where a sleeping replica's weights are; None: the host of its GPUs
    last_request_at: float | None = None  # when it last had a request in flight; None: never
    ready_since: float | None = None  # when it was last placed, woken or moved onto its GPUs; None: long ago
    mps_percentage: int | None = None  # as last planned (a replica held on a stale host keeps it)


@dataclass(frozen=True)
class Settings:
    """Tunables of one planning pass, with the defaults the console uses."""

    quiet_window_s: float = 300.0  # within its SLO this long before a replica is taken away
    cooldown_s: float = 120.0  # between two changes of one deployment's replica count
    search_budget_s: float = 0.5  # wall-clock budget of memory-optimized's improvement search
    search_iterations: int | None = None  # iteration budget of that search (None: the time budget only)
    seed: int = 0  # the search's random choices, so a plan is reproducible
    max_moves: int | None = None  # moves of existing replicas allowed per plan (None: any that place more)
    preempt: bool = True  # whether higher tiers may take lower tiers' room
    idle_grace_s: float = 2.0  # a replica with no request for this long is idle (demand may put it to sleep)
    min_residency_s: float = 5.0  # placed or woken this recently: not taken off its GPUs for demand or a swap


@dataclass(frozen=True)
class PlanInput:
    """Everything one planning pass looks at. Time is passed in (`now`); the core never reads a clock for it."""

    gpus: tuple[Gpu, ...]
    deployments: tuple[Deployment, ...]
    replicas: tuple[Replica, ...] = ()
    hosts: tuple[Host, ...] = ()
    strategy: Strategy = "memory-optimized"
    buffer_bytes: int = 0  # kept free on every GPU
    now: float = 0.0
    settings: Settings = field(default_factory=Settings)
    # Placement constraints beyond the built-in ones (constraints.Constraint), checked after them: a quota, say.
    constraints: tuple[Constraint, ...] = ()


@dataclass(frozen=True)
class PlannedReplica:
    """One replica's decision: where it runs (or sleeps), what changes, and why."""

    deployment: str
    index: int
    gpus: tuple[str, ...]  # empty unless ready
    host: str | None  # the host it runs or sleeps on
    state: State
    action: Action
    reserved_bytes: int  # all its GPUs together; 0 unless ready
    mps_percentage: int | None  # CUDA MPS active-thread percentage on a shared GPU; None when alone
    reason: str
    from_gpus: tuple[str, ...] = ()  # where it was, for moves, preemptions, sleeps and stops
    preempted_by: str | None = None  # "deployment#index" that took its room (preempt, sleep)


def _planned_replica_init(self, deployment, index, gpus, host, state, action, reserved_bytes, mps_percentage,
                          reason, from_gpus=(), preempted_by=None) -> None:
    # The generated frozen __init__ sets each field through object.__setattr__ (3 µs a replica); a plan
    # holds one per replica, 10,000 in a large fleet, so the instance dict is filled at once instead.
    self.__dict__.update(deployment=deployment, index=index, gpus=gpus, host=host, state=state, action=action,
                         reserved_bytes=reserved_bytes, mps_percentage=mps_percentage, reason=reason,
                         from_gpus=from_gpus, preempted_by=preempted_by)


PlannedReplica.__init__ = _planned_replica_init  # type: ignore[method-assign]


@dataclass(frozen=True)
class Move:
    """An existing replica the plan relocates (reload on the new GPUs), and why."""

    deployment: str
    index: int
    from_gpus: tuple[str, ...]
    to_gpus: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Unplaced:
    """A wanted replica that gets no GPU, with what would change that."""

    deployment: str
    index: int
    reason: str


@dataclass(frozen=True)
class ScaleDecision:
    """A deployment's replica count for this pass: current (as decided before) and target."""

    deployment: str
    current: int
    target: int
    reason: str


def _scale_decision_init(self, deployment, current, target, reason) -> None:
    # As for PlannedReplica: one per deployment per plan.
    self.__dict__.update(deployment=deployment, current=current, target=target, reason=reason)


ScaleDecision.__init__ = _scale_decision_init  # type: ignore[method-assign]


@dataclass(frozen=True)
class GpuBalance:
    """One GPU's ledger after the plan: free = total - foreign - reserved - buffer."""

    gpu: str
    host: str
    total_bytes: int
    foreign_bytes: int
    reserved_bytes: int
    buffer_bytes: int
    free_bytes: int


def _gpu_balance_init(self, gpu, host, total_bytes, foreign_bytes, reserved_bytes, buffer_bytes, free_bytes) -> None:
    # As for PlannedReplica: one per GPU per plan.
    self.__dict__.update(gpu=gpu, host=host, total_bytes=total_bytes, foreign_bytes=foreign_bytes,
                         reserved_bytes=reserved_bytes, buffer_bytes=buffer_bytes, free_bytes=free_bytes)


GpuBalance.__init__ = _gpu_balance_init  # type: ignore[method-assign]


@dataclass(frozen=True)
class SearchReport:
    """What memory-optimized's improvement search did."""

    iterations: int
    placed_extra: int  # replicas it placed beyond best-fit decreasing
    stopped_by: str  # "all placed" | "bound" | "stalled" | "time budget" | "iteration budget"


@dataclass(frozen=True)
class DemandOutcome:
    """What the plan does for a deployment with requests waiting at the gateway: served (a replica is ready),
    waiting (room exists in principle; someone must go idle or finish its residency) or refused (never, as
    things stand: the gateway answers 503 with `reason`)."""

    deployment: str
    status: Literal["served", "waiting", "refused", "blocked"]  # blocked: no request waits, one would be refused
    reason: str


@dataclass(frozen=True)
class Plan:
    """The outcome of one pass: every replica with its reason, the moves, the refusals, the scale decisions."""

    strategy: str
    replicas: tuple[PlannedReplica, ...]
    moves: tuple[Move, ...]
    unplaced: tuple[Unplaced, ...]
    scale: tuple[ScaleDecision, ...]
    gpus_used: int  # GPUs holding at least one ready replica
    memory_utilization: float  # (foreign + reserved) / total over the GPUs in use
    elapsed_ms: float
    search: SearchReport | None = None
    demands: tuple[DemandOutcome, ...] = ()  # one per deployment with demand > 0
    outlooks: tuple[DemandOutcome, ...] = ()  # "blocked", for deployments none ready, none waiting, none servable
    gpu_state: tuple = field(default=((), (), 0), repr=False, compare=False)  # (gpus, reserved, buffer)

    @cached_property
    def ledger(self) -> tuple[GpuBalance, ...]:
        """Every GPU after the plan: free = total - foreign - reserved - buffer (built on first use)."""
        gpus, reserved, buffer = self.gpu_state
        return tuple(GpuBalance(g.id, g.host, g.total_bytes, g.used_bytes, r, buffer,
                                g.total_bytes - g.used_bytes - buffer - r) for g, r in zip(gpus, reserved, strict=True))
