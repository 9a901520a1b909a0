"""The Teams page: a member sees their teams (every team for admins) with their members, deployments, limits and
quota; admins change them and make teams, through the same services as the REST API, so every change is on the
timeline with who made it. A refused form comes back with its reason beside the field, and nothing changed."""

from __future__ import annotations

import time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from console.accounts import limits, teams
from console.accounts.auth import actor_of
from console.accounts.team_summary import Refusal, limits_from_form, listed, summaries
from console.errors import DomainError
from console.pagination import page_number, page_within, pager

PAGE = "accounts/teams.html"
PER_PAGE = 50


def _page(request, refusal: Refusal | None = None):
    number, note = page_number(request.GET)
    page, rows, past = page_within(listed(request.user), number, PER_PAGE)
    shown = summaries(rows, time.time(), refusal)
    context = {"teams": shown, "pager": pager(page, request.GET), "notes": [n for n in (note, past) if n],
               "admin": teams.is_admin(request.user), "refusal": refusal,
               # A refusal about a team not on this page (or one the user may not see) is said at the top.
               "loose_refusal": refusal if refusal and refusal.form != "create"
               and refusal.team not in {s.team.name for s in shown} else None}
    return render(request, PAGE, context, status=refusal.error.status if refusal else 200)


def _saved(request, name: str, said: str):
    messages.success(request, said)
    return redirect(reverse("teams") + f"#team-{name}")


@login_required
@require_safe
def teams_page(request):
    return _page(request)


@login_required
@require_POST
def create(request):
    name = request.POST.get("name", "").strip()
    members = [m.strip() for m in request.POST.get("members", "").split(",") if m.strip()]
    try:
        teams.create_team(request.user, name, members, actor=actor_of(request))
    except DomainError as e:
        return _page(request, Refusal("create", e, request.POST))
    return _saved(request, name, f"Team {name} created.")


@login_required
@require_POST
def change_limits(request, name: str):
    try:
        limits.set_team_limits(request.user, name, limits_from_form(request.POST), actor=actor_of(request))
    except DomainError as e:
        return _page(request, Refusal("limits", e, request.POST, name))
    return _saved(request, name, f"Saved team {name}'s limits: the gateways apply them within a second.")


@login_required
@require_POST
def add_member(request, name: str):
    username = request.POST.get("user", "").strip()
    try:
        teams.add_member(request.user, name, username, actor=actor_of(request))
    except DomainError as e:
        return _page(request, Refusal("members", e, request.POST, name))
    return _saved(request, name, f"{username} is in team {name} (the gateway within 10 s).")


@login_required
@require_POST
def remove_member(request, name: str, user: str):
    try:
        teams.remove_member(request.user, name, user, actor=actor_of(request))
    except DomainError as e:
        return _page(request, Refusal("members", e, request.POST, name))
    return _saved(request, name, f"{user} left team {name} (the gateway within 10 s).")
