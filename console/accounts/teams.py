"""Teams and ownership: the team a new object goes to, and managing teams (admins). Which teams a user acts within
and what that lets them see is the team scope's (console/accounts/scope.py; `teams_of`, `scoped` and the rest are
named here too, as callers have long imported them). The gateway carries the same teams in its cached caller
(console/gateway/auth.py).

Another team's object is answered as if it did not exist (404 "no deployment named X"): a name is no secret
within a team, but telling others it exists would be. Names stay one namespace across teams (the gateway's
`model` field names any of them), so creating a name another team holds is still refused with 409."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from console.accounts.models import DEFAULT_TEAM, DEFAULT_TEAM_FIELDS, Team
from console.accounts.scope import ALL, Teams, is_admin, scoped, teams_of
from console.catalog.names import is_name, validate_name
from console.errors import Conflict, Forbidden, Invalid, NotFound
from console.events.record import Note, record

__all__ = ["ALL", "Teams", "add_member", "creation_team", "create_team", "get_team", "is_admin", "remove_member",
           "scoped", "teams_of", "visible_teams"]


def creation_team(user, name: str | None = None) -> Team:
    """The team an object `user` creates goes to: `name` (a team they are a member of; any for admins), or else
    their only team (admins in none or several: the default team). Refused naming the `team` field."""
    if name:
        team = Team.objects.filter(name=name).first() if is_name(name) else None
        if team is not None and (is_admin(user) or team.members.filter(pk=user.pk).exists()):
            return team
        raise Invalid(f"team: {user.get_username()} is not a member of a team named {name[:63]!r}; "
                      "GET /api/v1/teams lists yours", field="team")
    mine = list(Team.objects.filter(members=user)[:2]) if user.is_authenticated else []
    if len(mine) == 1:
        return mine[0]
    if is_admin(user):
        return Team.objects.get_or_create(name=DEFAULT_TEAM, defaults=DEFAULT_TEAM_FIELDS)[0]
    if not mine:
        raise Forbidden(f"{user.get_username()} is in no team, so cannot own anything; ask an admin to add you to "
                        "one (POST /api/v1/teams/NAME/members)")
    names = ", ".join(Team.objects.filter(members=user).values_list("name", flat=True))
    raise Invalid(f"team: {user.get_username()} is in several teams ({names}); say which one owns it", field="team")


def visible_teams(user) -> QuerySet[Team]:
    """The teams `user` may see: their own, or all for admins."""
    rows = Team.objects.prefetch_related("members")
    return rows if is_admin(user) else rows.filter(members=user)


def get_team(user, name: str) -> Team:
    team = visible_teams(user).filter(name=name).first() if is_name(name) else None
    if team is None:
        raise NotFound(f"no team named {name[:63]!r}; GET /api/v1/teams lists them")
    return team


def _require_admin(user, what: str) -> None:
    if not is_admin(user):
        raise Forbidden(f"only admins (staff users) may {what}; {user.get_username()} is not staff")


def create_team(requester, name: str, members: list[str] = (), actor: str = "") -> Team:
    """A new team (admins), with `members` (user names) in it."""
    _require_admin(requester, "create teams")
    validate_name(name, "team")
    users = _users(members)
    try:
        with transaction.atomic():
            team = Team.objects.create(name=name)
            team.members.add(*users)
            joined = f" with {', '.join(u.get_username() for u in users)}" if users else ""
            record([Note(team.timeline_object, "TeamCreated", f"team {name} created{joined}", actor=actor,
                         folds=False)])
    except IntegrityError:
        raise Conflict(f"a team named {name!r} already exists", field="name") from None
    return team


def add_member(requester, team_name: str, username: str, actor: str = "") -> Team:
    """Put a user in a team (admins); adding a member twice changes nothing."""
    _require_admin(requester, "change a team's members")
    team = get_team(requester, team_name)
    user = _users([username], "user")[0]
    with transaction.atomic():
        if not team.members.filter(pk=user.pk).exists():
            team.members.add(user)
            record([Note(team.timeline_object, "MemberAdded", f"{username} joined team {team.name}", actor=actor,
                         folds=False)])
    return team


def remove_member(requester, team_name: str, username: str, actor: str = "") -> Team:
    """Take a user out of a team (admins); their tokens stop reaching its objects (the gateway within 10 s)."""
    _require_admin(requester, "change a team's members")
    team = get_team(requester, team_name)
    user = team.members.filter(username=username).first()
    if user is None:
        raise NotFound(f"{username[:150]!r} is not a member of team {team.name}")
    with transaction.atomic():
        team.members.remove(user)
        record([Note(team.timeline_object, "MemberRemoved", f"{username} left team {team.name}", actor=actor,
                     folds=False)])
    return team


def _users(names: list[str], field: str = "members") -> list:
    wanted = list(dict.fromkeys(names))
    found = {u.get_username(): u for u in get_user_model().objects.filter(username__in=wanted)}
    missing = [n for n in wanted if n not in found]
    if missing:
        raise Invalid(f"{field}: no user named {missing[0][:150]!r}", field=field)
    return [found[n] for n in wanted]


def join_default_team(sender, instance, created: bool, raw: bool = False, **kwargs) -> None:
    """A new user joins the default team (post_save), as every user did when teams came: one-team installs keep
    working unchanged, and an admin moves people into other teams."""
    if created and not raw:
        Team.objects.get_or_create(name=DEFAULT_TEAM, defaults=DEFAULT_TEAM_FIELDS)[0].members.add(instance)
