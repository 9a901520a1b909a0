"""Making, listing and revoking API tokens (shared by the REST API and the Tokens page): who may see and do
what, and every refusal naming the field at fault. A refused request changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.utils import timezone

from console.accounts import expiry
from console.accounts.limits import checked_limit
from console.accounts.models import ApiToken, Scope
from console.accounts.teams import Teams, scoped, teams_of
from console.deployments.models import Deployment
from console.errors import Forbidden, Invalid, NotFound

MAX_TOKEN_NAME = 100  # ApiToken.name
MAX_DEPLOYMENTS = 100  # a token limited to more than this is better made unlimited


def is_admin(user) -> bool:
    """Staff: sees and revokes everyone's tokens, makes tokens for other users, and manages the agents' tokens."""
    return bool(user.is_active and user.is_staff)


def require_admin(user, what: str) -> None:
    if not is_admin(user):
        raise Forbidden(f"only staff users may {what}; {user.get_username()} is not staff")


def visible_tokens(user) -> QuerySet[ApiToken]:
    """The tokens `user` may see and revoke, newest first: their own, or everyone's for staff. Revoked ones are
    gone from every list."""
    rows = ApiToken.objects.select_related("user").filter(revoked__isnull=True).order_by("-created", "-pk")
    return rows if is_admin(user) else rows.filter(user=user)


@dataclass(frozen=True)
class TokenRequest:
    """A token as asked for, unchecked: from the API's body or the page's form."""

    name: str
    scope: str = Scope.ALL
    deployments: Sequence[str] = ()
    expires_in: int | str | None = None
    expires: str | None = None
    user: str | None = None  # whose token: another user's name (staff only); None for the requester's own
    rpm_limit: int | None = None  # requests and tokens per minute at the gateway; None: none
    tpm_limit: int | None = None


def create_token(requester, ask: TokenRequest, via: ApiToken | None = None, actor: str = "") -> tuple[ApiToken, str]:
    """Check `ask` and make the token; returns the row and the plaintext (shown once). `via`: the token the request
    came with, if any: what it makes may not outlive it."""
    name = _name(ask.name)
    scope = _scope(ask.scope)
    owner = _owner(requester, ask.user)
    deployments = _deployments(ask.deployments, scope, teams_of(owner))
    expires = expiry.expiry(ask.expires_in, ask.expires, timezone.now())
    if via is not None and via.expires is not None and (expires is None or expires > via.expires):
        raise Forbidden(f"the token this request came with expires at {expiry.stamp(via.expires)}, and a token it "
                        "makes may not outlive it: give expires_in or expires before then, or sign in to make it")
    limits = {f: checked_limit(getattr(ask, f), f) for f in ("rpm_limit", "tpm_limit")}
    return ApiToken.issue(owner, name, scope=scope, expires=expires, deployments=deployments, actor=actor, **limits)


def revoke_token(requester, token_id: int, actor: str = "") -> ApiToken:
    """Revoke one of the tokens `requester` may see; from now on it is refused (401, saying so)."""
    row = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    if row is None or not (is_admin(requester) or row.user_id == requester.pk):
        raise NotFound(f"no token {token_id} that you may revoke; GET /api/v1/tokens lists them")
    if not row.revoke(actor=actor):
        row.refresh_from_db(fields=["revoked"])
        raise NotFound(f"token {token_id} was already revoked at {expiry.stamp(row.revoked)}")
    return row


def _name(name: str) -> str:
    name = name.strip()
    if not name:
        raise Invalid("name is empty; give the token a name people will recognise, such as the script using it",
                      field="name")
    if len(name) > MAX_TOKEN_NAME:
        raise Invalid(f"name is {len(name)} characters long, above {MAX_TOKEN_NAME}", field="name")
    if not name.isprintable():
        raise Invalid("name must not contain control characters (newlines, tabs)", field="name")
    return name


def _scope(scope: str) -> str:
    if scope not in Scope.values:
        choices = ", ".join(f"{value} ({label})" for value, label in Scope.choices)
        raise Invalid(f"scope: unknown scope {str(scope)[:40]!r}; choose one of: {choices}", field="scope")
    return scope


def _deployments(names: Sequence[str], scope: str, teams: Teams) -> list[str]:
    wanted = sorted({n.strip() for n in names if n.strip()})
    if not wanted:
        return []
    if scope != Scope.INFERENCE:
        raise Invalid("deployments: a token limited to deployments may only call the inference gateway; give it "
                      "scope inference, or no deployments for a token that may call them all", field="deployments")
    if len(wanted) > MAX_DEPLOYMENTS:
        raise Invalid(f"deployments: {len(wanted)} named, at most {MAX_DEPLOYMENTS}; leave the list empty for a token "
                      "that may call every deployment", field="deployments")
    # Only its owner's teams' deployments: another team's is named as missing, not leaked.
    known = set(scoped(Deployment.objects.filter(name__in=wanted), teams).values_list("name", flat=True))
    missing = [n for n in wanted if n not in known]
    if missing:
        shown = ", ".join(repr(n[:70]) for n in missing[:5]) + (" and more" if len(missing) > 5 else "")
        raise Invalid(f"deployments: no deployment named {shown}; GET /api/v1/deployments lists them",
                      field="deployments")
    return wanted


def _owner(requester, username: str | None):
    if username is None or username == requester.get_username():
        return requester
    require_admin(requester, "make tokens for another user")
    owner = get_user_model().objects.filter(username=username).first()
    if owner is None:
        raise Invalid(f"user: no user named {username[:150]!r}", field="user")
    if not owner.is_active:
        raise Invalid(f"user: {username!r} is disabled; its tokens would be refused", field="user")
    return owner
