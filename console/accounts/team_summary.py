"""What the Teams page shows of each team (its members, deployments, limits and how much of its quota this period
has used) and its limits form: stored values, or what was typed beside the reason it was refused. The limits are
checked and set by console/accounts/limits.py, as for the REST API."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet

from console.accounts import counters
from console.accounts.limits import TEAM_FIELDS
from console.accounts.models import QuotaPeriod, Team
from console.accounts.teams import visible_teams
from console.errors import DomainError
from console.forms import whole_number
from console.scheduler.types import TIERS

NUMBERS = ("rpm_limit", "tpm_limit", "token_quota")
LABELS = {"rpm_limit": "Requests per minute", "tpm_limit": "Tokens per minute", "token_quota": "Token quota",
          "quota_period": "Quota period", "priority_ceiling": "Priority ceiling"}
HINTS = {"rpm_limit": "all its deployments together; empty: no limit",
         "tpm_limit": "prompt and completion, of finished requests; empty: no limit",
         "token_quota": "tokens per quota period; empty: no quota",
         "quota_period": "UTC calendar periods; a week starts on Monday",
         "priority_ceiling": "the highest priority its deployments may have"}
CHOICES = {"quota_period": QuotaPeriod.values, "priority_ceiling": list(TIERS)}


@dataclass(frozen=True)
class Refusal:
    """A refused form: which (`limits`, `members` or `create`) of which team, the reason, and what was typed."""

    form: str
    error: DomainError
    values: Mapping[str, str]
    team: str = ""

    @property
    def field(self) -> str | None:
        return (self.error.fields or [None])[0]


@dataclass(frozen=True)
class TeamSummary:
    team: Team
    members: list[str]
    deployments: int
    quota_used: int
    quota_resets: datetime
    fields: list[dict] = field(default_factory=list)  # the limits form's inputs (admins)
    refusal: Refusal | None = None  # of this team's limits or members form

    @property
    def quota_percent(self) -> int | None:
        """How much of the quota is used, 0 to 100; None without a quota. A quota of 0 (the team is blocked) is all
        used: 100."""
        quota = self.team.token_quota
        if quota is None:
            return None
        return 100 if quota <= 0 else min(100, round(100 * self.quota_used / quota))


def listed(user) -> QuerySet[Team]:
    """The teams `user` sees on the page (their own; all for admins), each with its deployments counted."""
    return visible_teams(user).annotate(deployment_count=Count("deployments", distinct=True))


def summaries(teams: Iterable[Team], now: float, refusal: Refusal | None = None) -> list[TeamSummary]:
    teams = list(teams)
    used = counters.quotas_used(((t.pk, t.quota_period) for t in teams), now)
    out = []
    for team in teams:
        mine = refusal if refusal is not None and refusal.team == team.name else None
        out.append(TeamSummary(team, sorted(u.get_username() for u in team.members.all()), team.deployment_count,
                               used[team.pk], counters.quota_resets(team.quota_period, now),
                               _fields(team, mine if mine and mine.form == "limits" else None), mine))
    return out


def _fields(team: Team, refusal: Refusal | None) -> list[dict]:
    shown = []
    for name in TEAM_FIELDS:
        value = refusal.values.get(name, "") if refusal else getattr(team, name)
        shown.append({"name": name, "label": LABELS[name], "hint": HINTS[name], "choices": CHOICES.get(name),
                      "value": "" if value is None else str(value),
                      "error": str(refusal.error) if refusal and refusal.field == name else ""})
    return shown


def limits_from_form(form: Mapping[str, str]) -> dict[str, Any]:
    """The changes the limits form asks for: empty numbers are no limit; fields not sent stay as they are. What is
    not a whole number is refused here, naming the field; the rest is limits.set_team_limits()'s to check."""
    changes: dict[str, Any] = {}
    for name in TEAM_FIELDS:
        if name in form:
            changes[name] = whole_number(form[name], name) if name in NUMBERS else form[name]
    return changes
