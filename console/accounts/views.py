"""The Tokens page: a person's API tokens (everyone's for staff) with their limits at the gateway and, for staff, the
agents' tokens. A new secret is shown in the answer to the form that made it, once, and never stored."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from console.accounts import agents, limits, services
from console.accounts.auth import actor_of
from console.accounts.expiry import LIFETIME_FORM
from console.accounts.models import Scope
from console.errors import DomainError
from console.forms import whole_number
from console.pagination import page_number, page_within, pager

PAGE = "accounts/tokens.html"
PER_PAGE = 100


def _page(request, status: int = 200, **extra):
    admin = services.is_admin(request.user)
    number, note = page_number(request.GET)
    page, tokens, past = page_within(services.visible_tokens(request.user), number, PER_PAGE)
    context = {"tokens": tokens, "pager": pager(page, request.GET), "notes": [n for n in (note, past) if n],
               "admin": admin, "scopes": Scope.choices, "lifetime_form": LIFETIME_FORM}
    refused = extra.get("limits_refused")
    if refused and refused["token"] not in {t.pk for t in tokens}:  # no row to say it beside
        context["notes"].append(f"Not changed: {refused['error']}.")
    if admin:
        number, _ = page_number(request.GET, "apage")
        agent_page, rows, _ = page_within(agents.credentials(request.user), number, PER_PAGE, "apage")
        context |= {"agents": agents.shown(rows), "agent_pager": pager(agent_page, request.GET, "apage")}
    return render(request, PAGE, context | extra, status=status)


@login_required
@require_safe
def tokens_page(request):
    return _page(request)


@login_required
@require_POST
def create(request):
    form = request.POST
    try:
        ask = services.TokenRequest(name=form.get("name", ""), scope=form.get("scope", Scope.ALL),
                                    deployments=form.get("deployments", "").split(","),
                                    expires_in=form.get("expires_in", "").strip() or None,
                                    user=form.get("user", "").strip() or None, **_rates(form))
        row, secret = services.create_token(request.user, ask, actor=actor_of(request))
    except DomainError as e:
        messages.error(request, f"Token not created: {e}. Nothing was stored.")
        return redirect("tokens")
    return _page(request, secret=secret, secret_for=f"API token {row.name}")


@login_required
@require_POST
def revoke(request, token_id: int):
    try:
        row = services.revoke_token(request.user, token_id, actor=actor_of(request))
    except DomainError as e:
        messages.error(request, f"Not revoked: {e}.")
    else:
        messages.success(request, f"Token {row.name} revoked: it is refused from now on (the gateway within 10 s).")
    return redirect("tokens")


@login_required
@require_POST
def change_limits(request, token_id: int):
    """The small form on a token's row: its requests and tokens per minute (empty: none), as PATCH
    /api/v1/tokens/ID sets them. Refused: the page again, the reason beside the field and the typed values."""
    try:
        row = limits.set_token_limits(request.user, token_id, _rates(request.POST), actor=actor_of(request))
    except DomainError as e:
        refused = {"token": token_id, "error": str(e), "field": (e.fields or [None])[0], "values": request.POST}
        return _page(request, status=e.status, limits_refused=refused)
    messages.success(request, f"Saved the limits of token {row.name}: the gateway applies them within 10 s.")
    return redirect("tokens")


def _rates(form) -> dict[str, int | None]:
    """Requests and tokens per minute as typed: empty is no limit; the rest is checked by the services."""
    return {f: whole_number(form.get(f), f) for f in limits.RATE_FIELDS}


@login_required
@require_POST
def issue_agent(request):
    host_name = request.POST.get("host_name", "").strip()
    try:
        _, secret, rotated = agents.issue(request.user, host_name, actor=actor_of(request))
    except DomainError as e:
        messages.error(request, f"Agent token not issued: {e}.")
        return redirect("tokens")
    what = f"agent token of {host_name}" + (" (the old one is revoked and its links ended)" if rotated else "")
    return _page(request, secret=secret, secret_for=what)


@login_required
@require_POST
def revoke_agent(request, host_name: str):
    try:
        agents.revoke(request.user, host_name, actor=actor_of(request))
    except DomainError as e:
        messages.error(request, f"Not revoked: {e}.")
    else:
        messages.success(request, f"Agent token of {host_name} revoked: its agent is disconnected and refused.")
    return redirect("tokens")
