"""Deploying a model from the console: the Models page's one-click Deploy (a POST with nothing in it: defaults) and
its deploy form page (name, team, engine, priority, SLO, replica range, serving shape). A deployment is made by
services.create_deployment(), as for POST /api/v1/deployments; a refusal comes back as the form, with the reason
beside the field at fault, and nothing stored."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from console.accounts.auth import actor_of
from console.accounts.teams import creation_team, teams_of, visible_teams
from console.catalog import memory
from console.catalog.models import Model
from console.catalog.services import get_model
from console.deployments import deploy_form
from console.deployments.services import create_deployment, unused_deployment_name
from console.deployments.views import render_partial_or_full
from console.errors import DomainError, NotFound

PAGE = "deployments/deploy.html"
FORM = "deployments/_deploy_form.html"


def _model(request, name: str) -> Model:
    """One of the viewer's teams' models; another team's is a 404, as a name nobody has."""
    try:
        return get_model(name, teams=teams_of(request.user))
    except NotFound as e:
        raise Http404(str(e)) from None


def _context(request, model: Model, values: dict, error: DomainError | None = None) -> dict:
    teams = {t.name: t for t in visible_teams(request.user)}
    team = teams.get(values.get("team")) or model.team  # what the ceiling is shown for
    return {"m": model, "v": values, "team": team, "team_choices": sorted(teams),
            "priorities": deploy_form.priority_choices(team), "engines": deploy_form.engine_choices(),
            "dtypes": memory.WORKER_DTYPES, "error": str(error) if error else "",
            "error_field": (error.fields or [""])[0] if error else ""}


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def deploy(request, name: str):
    """GET: the deploy form (for htmx, the form's card alone, drawn again for the team chosen); POST: deploy."""
    model = _model(request, name)
    base = deploy_form.initial(unused_deployment_name(model.name), model.team)
    if request.method != "POST":
        return render_partial_or_full(request, FORM, _context(request, model, deploy_form.typed(request.GET, base)),
                                      full=PAGE)
    try:
        asked = deploy_form.parse(request.POST)
        team = creation_team(request.user, asked.team) if asked.team else None  # else the model's team
        deploy_form.check_engine(asked.policy.get("engine", "auto"))
        dep = create_deployment(asked.name or base["name"], model.name, actor=actor_of(request), team=team,
                                teams=teams_of(request.user), **asked.serving, **asked.policy)
    except DomainError as e:
        context = _context(request, model, deploy_form.typed(request.POST, base), e)
        if request.htmx:  # swapped into the page in place: htmx swaps 2xx answers only
            return render_partial_or_full(request, FORM, context, full=PAGE)
        return render(request, PAGE, context, status=e.status)
    messages.success(request, f"Deployment {dep.name} created (team {dep.team.name}, priority {dep.priority}"
                     + (f", p95 target {dep.slo_latency_ms} ms" if dep.slo_latency_ms else "")
                     + "); the scheduler is placing it.")
    to = reverse("deployment", args=[dep.name])
    return HttpResponseClientRedirect(to) if request.htmx else redirect(to)
