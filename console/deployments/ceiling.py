"""A team's priority ceiling: the highest tier its deployments may ask for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from console.errors import Invalid
from console.scheduler.types import TIER_RANK

if TYPE_CHECKING:
    from console.accounts.models import Team


def check_ceiling(priority: str, team: Team) -> None:
    """Refuse a priority above the team's ceiling (it binds admins too: they raise the ceiling first)."""
    ceiling = team.priority_ceiling
    if TIER_RANK.get(priority, len(TIER_RANK)) < TIER_RANK.get(ceiling, len(TIER_RANK)):
        raise Invalid(f"priority {priority} is above team {team.name}'s priority ceiling ({ceiling}); an admin can "
                      f"raise it (PATCH /api/v1/teams/{team.name} with priority_ceiling), or choose {ceiling} or "
                      "lower", field="priority")
