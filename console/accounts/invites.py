"""Inviting people: an admin puts a person in a team and gets a one-time link that lets them set a password, with no
email server in between (the admin passes the link on). The link is Django's password-reset token
(`default_token_generator`): signed with the secret key, bound to the user's password and last sign-in, so it stops
working once used, when a newer invite replaces it, and after PASSWORD_RESET_TIMEOUT. The invite and its use are on
the timeline as the team's events (`team/NAME`), so the Audit page shows who invited whom.

Only a person with no usable password is invited: a new user (made here), or one made by `manage.py createapitoken`
(API access only). Someone who already signs in is added to a team with the Teams page's Add a member instead."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.utils.encoding import force_bytes
from django.utils.http import base36_to_int, urlsafe_base64_encode

from console.accounts.expiry import stamp
from console.accounts.models import DEFAULT_TEAM, Team
from console.accounts.teams import get_team, is_admin
from console.errors import Conflict, Forbidden, Invalid
from console.events.record import Note, record

USER_FIELD = "user"  # the form's and the errors' name for the person invited


@dataclass(frozen=True)
class Invite:
    """An invite made: who, into which team, the link's path (absolute on the console's address) and its end."""

    username: str
    team: str
    path: str
    expires: datetime
    created_user: bool


def require_inviter(requester) -> None:
    """Refuse anyone but an admin (a staff user): an invite gives a person a way in."""
    if not is_admin(requester):
        raise Forbidden(f"only admins (staff users) invite people; {requester.get_username()} is not staff, so ask "
                        "an admin to invite them")


def invite(requester, team_name: str, username: str, actor: str = "") -> Invite:
    """Invite `username` into one of the teams (admins only; see issue_invite)."""
    require_inviter(requester)
    return issue_invite(get_team(requester, team_name), username, actor)


def issue_invite(team: Team, username: str, actor: str = "") -> Invite:
    """Make (or take, when it has no password) the user `username`, put them in `team`, and return a link that lets
    them set a password once. A new user is in `team` only, not also in the default team as other new users are: an
    admin who invites someone to a team means that team. Any earlier link of theirs stops working."""
    users = get_user_model()
    _check_username(users, username)
    with transaction.atomic():
        user = users.objects.select_for_update().filter(username=username).first()
        created = user is None
        if created:
            user = users.objects.create_user(username)  # no password given: an unusable one
            if team.name != DEFAULT_TEAM:
                user.teams.clear()
        elif user.has_usable_password():
            raise Conflict(f"{username} already has a password and signs in with it: add them to team {team.name} "
                           "with Add a member instead (an admin can reset a forgotten password with manage.py "
                           "changepassword)", field=USER_FIELD)
        elif not user.is_active:
            raise Conflict(f"{username}'s account is deactivated; an admin reactivates it in the Django admin first",
                           field=USER_FIELD)
        else:
            user.set_unusable_password()  # a fresh one: the links made before for this user stop working
            user.save(update_fields=["password"])
        team.members.add(user)
        expires = timezone.now() + timedelta(seconds=settings.PASSWORD_RESET_TIMEOUT)
        path = reverse("invite-accept", kwargs={"uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
                                                "token": default_token_generator.make_token(user)})
        who = "a new user" if created else "a user with no password until now"
        record([Note(team.timeline_object, "Invited", f"{username} ({who}) invited to team {team.name}: a one-time "
                     f"link to set a password, valid until {stamp(expires)}", actor=actor, folds=False)])
    return Invite(username, team.name, path, expires, created)


def _check_username(users, username: str) -> None:
    field = users._meta.get_field(users.USERNAME_FIELD)
    problem = "is empty" if not username else (f"is {len(username)} characters long, above {field.max_length}"
                                               if len(username) > field.max_length else "")
    if not problem:
        try:
            users.username_validator(username)
        except ValidationError:
            problem = "has characters a user name may not have (letters, digits and @ . + - _ only)"
    if problem:
        raise Invalid(f"user name {username[:150]!r} {problem}", field=USER_FIELD)


def accepted(user) -> None:
    """Tell each of the user's teams' timelines that they set their password from an invite."""
    name = user.get_username()
    record([Note(team.timeline_object, "InviteAccepted", f"{name} set a password from their invite and can sign in",
                 actor=f"user {name}", folds=False) for team in user.teams.all()])


# A link that does not verify says the same whoever it names, or nobody: a forged one learns nothing of accounts.
UNUSABLE = ("This link does not work: it was used already (then sign in with the password you set), a newer invite "
            "replaced it, or it was cut short. Open the newest link whole, or ask an admin for a new one.")


def link_refusal(user, token: str | None) -> tuple[int, str]:
    """Why an invite link cannot be used, in words the person who opened it can act on, and the HTTP status: 410 for
    one that verifies and has expired, else 404, alike for every link that does not verify (used, replaced, cut
    short, forged, naming nobody): whether an account exists, or has a password, is not told."""
    issued = _issued_at(user, token) if user is not None and token else None
    if issued is not None:
        ended = issued + timedelta(seconds=settings.PASSWORD_RESET_TIMEOUT)
        if ended < timezone.now():
            return 410, f"This link expired at {stamp(ended)}. Ask an admin for a new one."
    return 404, UNUSABLE


def _issued_at(user, token: str) -> datetime | None:
    """When `token` was made for `user` as they are now; None when it was not (used, replaced, or forged). Django's
    tokens are `TIMESTAMP-HASH`, the timestamp in seconds since 2001 on the generator's clock, which check_token()
    reads as this does, and answers only yes or no."""
    generator = default_token_generator
    try:
        ts = base36_to_int(token.split("-")[0])
    except ValueError:
        return None
    if not any(constant_time_compare(generator._make_token_with_timestamp(user, ts, secret), token)
               for secret in [generator.secret, *generator.secret_fallbacks]):
        return None
    age = generator._num_seconds(generator._now()) - ts
    return timezone.now() - timedelta(seconds=age)
