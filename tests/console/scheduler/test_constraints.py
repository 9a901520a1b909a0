"""The constraint seam: a new placement rule is one small class passed in with the input; the planner is untouched."""

from collections.abc import Iterable, Sequence

import pytest

from console.scheduler import STRATEGIES, Deployment, Gpu, PlanInput, Settings, plan
from console.scheduler.constraints import NEIGHBOURS, REQUIRED_SPREAD, for_pass

GiB = 1024**3
FAST = Settings(search_budget_s=30, search_iterations=200)


class TeamGpuCap:
    """Test-only: a team's replicas hold at most `cap` GPUs."""

    picked = False

    def __init__(self, team: int, cap: int) -> None:
        self.team, self.cap = team, cap

    def applies(self, unit) -> bool:
        return unit.demand.dep.team == self.team

    def check(self, ledger, unit, gpus: Sequence[int], leaving: Iterable = ()) -> str:
        gone = {id(v) for v in leaving}
        held = {g for g, holders in enumerate(ledger.holders)
                if any(v is not unit and id(v) not in gone and v.demand.dep.team == self.team for v in holders)}
        if len(held | set(gpus)) > self.cap:
            return f"team {self.team} holds {len(held)} of its {self.cap} GPUs"
        return ""

    def excluded(self, count: int) -> str:
        return f"; {count} GPU{'s' if count != 1 else ''} with room excluded: its team's cap of {self.cap} GPUs"


def fleet(n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(f"h{i // 2}/{i % 2}", f"h{i // 2}", 80 * GiB) for i in range(n))


def ready_gpus(result, name: str) -> list[str]:
    return sorted(g for r in result.replicas if r.deployment == name and r.state == "ready" for g in r.gpus)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_team_gpu_cap_added_with_the_input_keeps_the_teams_replicas_on_that_many_gpus(strategy):
    capped = Deployment("chat", 30 * GiB, replicas=6, team=1)
    other = Deployment("embed", 10 * GiB, replicas=2, team=2)
    request = PlanInput(fleet(4), (capped, other), strategy=strategy, settings=FAST,
                        constraints=(TeamGpuCap(team=1, cap=2),))
    result = plan(request)
    assert len(set(ready_gpus(result, "chat"))) == 2  # two replicas on each of its two GPUs
    assert len(ready_gpus(result, "chat")) == 4
    assert len(ready_gpus(result, "embed")) == 2  # another team is not held to it
    refused = [u.reason for u in result.unplaced if u.deployment == "chat"]
    assert len(refused) == 2
    assert all("with room excluded: its team's cap of 2 GPUs" in why for why in refused), refused


def test_without_the_cap_the_same_input_spreads_over_every_gpu():
    request = PlanInput(fleet(4), (Deployment("chat", 30 * GiB, replicas=6, team=1),), settings=FAST)
    assert len(set(ready_gpus(plan(request), "chat"))) == 4


def test_a_gang_is_judged_on_its_gpus_together():
    gang = Deployment("big", 100 * GiB, replicas=2, gpus_per_replica=2, team=1)
    result = plan(PlanInput(fleet(4), (gang,), settings=FAST, constraints=(TeamGpuCap(team=1, cap=3),)))
    assert len(ready_gpus(result, "big")) == 2  # the second gang would make 4 GPUs
    assert [u.index for u in result.unplaced] == [1]


def test_a_pass_keeps_the_built_in_constraints_first_then_the_inputs_own():
    cap = TeamGpuCap(team=1, cap=1)
    assert for_pass("memory-optimized") == (REQUIRED_SPREAD,)
    assert for_pass("latency-sensitive", (cap,)) == (REQUIRED_SPREAD, NEIGHBOURS, cap)
