"""Setting the gateway's limits (shared by the REST API and the pages): a team's requests and tokens per
minute, token quota and period, and priority ceiling (admins), and a token's own requests and tokens per minute.
Every change goes on the timeline with who made it; a refused request changes nothing. The gateway enforces them
(console/gateway/limits.py): team limits within a second, a token's within its cache (10 s)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction

from console.accounts.models import ApiToken, QuotaPeriod, Team
from console.accounts.teams import get_team, is_admin
from console.errors import Forbidden, Invalid, NotFound
from console.events.record import Note, record
from console.scheduler.types import TIERS

RATE_FIELDS = ("rpm_limit", "tpm_limit")
TEAM_FIELDS = (*RATE_FIELDS, "token_quota", "quota_period", "priority_ceiling")
MAX_LIMIT = 2**31 - 1  # the columns' range (token_quota's is wider)
MAX_QUOTA = 2**63 - 1


def checked_limit(value: Any, field: str, most: int = MAX_LIMIT) -> int | None:
    """A limit as given: a whole number of at least 1, or None for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise Invalid(f"{field} must be a whole number from 1 to {most}, or null for no limit; got {value!r}"[:200],
                      field=field)
    return value


def set_team_limits(requester, name: str, changes: Mapping[str, Any], actor: str = "") -> Team:
    """Change a team's limits, quota or priority ceiling (admins); fields left out stay as they are."""
    if not is_admin(requester):
        raise Forbidden(f"only admins (staff users) may change a team's limits, quota or priority ceiling; "
                        f"{requester.get_username()} is not staff")
    team = get_team(requester, name)
    wanted = _team_changes(changes)
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        said = _apply(team, wanted)
        if said:
            team.save(update_fields=[f for f in TEAM_FIELDS if f in wanted])
            record([Note(team.timeline_object, "TeamLimitsChanged", f"team {team.name}: {'; '.join(said)}",
                         actor=actor, folds=False)])
    return get_team(requester, name)


def set_token_limits(requester, token_id: int, changes: Mapping[str, Any], actor: str = "") -> ApiToken:
    """Change a token's requests and tokens per minute: its owner's or staff's, as revoking it is."""
    unknown = sorted(set(changes) - set(RATE_FIELDS))
    if unknown:
        raise Invalid(f"{unknown[0]!r} cannot be changed on a token (changeable: {', '.join(RATE_FIELDS)})",
                      field=unknown[0])
    wanted = {f: checked_limit(v, f) for f, v in changes.items()}
    with transaction.atomic():
        row = ApiToken.objects.select_for_update().select_related("user").filter(pk=token_id,
                                                                                revoked__isnull=True).first()
        if row is None or not (is_admin(requester) or row.user_id == requester.pk):
            raise NotFound(f"no token {token_id} that you may change; GET /api/v1/tokens lists them")
        said = _apply(row, wanted)
        if said:
            row.save(update_fields=list(wanted))
            record([Note(row.timeline_object, "TokenLimitsChanged", f"API token {row.prefix}… of user "
                         f"{row.user.get_username()}: {'; '.join(said)}", actor=actor, folds=False)])
    return row


def _team_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(changes) - set(TEAM_FIELDS))
    if unknown:
        raise Invalid(f"{unknown[0]!r} cannot be changed on a team (changeable: {', '.join(TEAM_FIELDS)})",
                      field=unknown[0])
    wanted = {}
    for field, value in changes.items():
        if field == "token_quota":
            wanted[field] = checked_limit(value, field, MAX_QUOTA)
        elif field == "quota_period":
            if value not in QuotaPeriod.values:
                raise Invalid(f"quota_period must be one of {', '.join(QuotaPeriod.values)} (UTC calendar periods); "
                              f"got {str(value)[:20]!r}", field=field)
            wanted[field] = value
        elif field == "priority_ceiling":
            if value not in TIERS:
                raise Invalid(f"priority_ceiling must be one of {', '.join(TIERS)}; got {str(value)[:20]!r}",
                              field=field)
            wanted[field] = value
        else:
            wanted[field] = checked_limit(value, field)
    return wanted


def _apply(row, wanted: Mapping[str, Any]) -> list[str]:
    """Set the changed fields on `row`; the words for the timeline ("rpm_limit none → 100")."""
    said = []
    for field, value in wanted.items():
        old = getattr(row, field)
        if old != value:
            said.append(f"{field} {'none' if old is None else old} → {'none' if value is None else value}")
            setattr(row, field, value)
    return said
