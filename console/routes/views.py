"""The Routes pages: the routes of the viewer's teams (every team's for admins), a form that creates one, and each
route's edit page (its branches and fallback) and delete. Everything goes through console/routes/services.py, as the
REST API does, so each change is on the timeline with who made it; a refused form comes back with the service's
reason beside the input it is about (a branch's beside its row), and nothing changed."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect

from console.accounts.auth import actor_of
from console.accounts.teams import creation_team, is_admin, scoped, teams_of, visible_teams
from console.deployments.views import login_required_htmx, render_partial_or_full
from console.errors import DomainError, NotFound
from console.pagination import page_number, page_within, pager
from console.routes import services
from console.routes.models import MAX_BRANCHES, MAX_WEIGHT, Route
from console.routes.route_form import RouteForm, blank, branches_of, fallback_choices, stored, submitted, target_choices

PAGE = "routes/page.html"
EDIT = "routes/edit.html"
FORM = "routes/_form.html"
ROW = "routes/_branch.html"
PER_PAGE = 50


def _form_context(request, form: RouteForm, route: Route | None = None) -> dict:
    teams = teams_of(request.user)
    return {"form": form, "route": route, "targets": target_choices(teams), "fallbacks": fallback_choices(teams),
            "team_choices": list(visible_teams(request.user).values_list("name", flat=True)),
            "action": reverse("route-edit", args=[route.name]) if route else reverse("routes"),
            "max_branches": MAX_BRANCHES, "max_weight": MAX_WEIGHT}


def _listed(request, form: RouteForm, status: int = 200):
    number, note = page_number(request.GET)
    rows = scoped(Route.objects.select_related("team", "fallback"), teams_of(request.user))
    page, window, past = page_within(rows, number, PER_PAGE)
    routes = [_summary(r) for r in window.prefetch_related("branches__deployment", "branches__adapter")]
    context = _form_context(request, form) | {
        "routes": routes, "pager": pager(page, request.GET), "notes": [n for n in (note, past) if n],
        "admin": is_admin(request.user), "show_team": is_admin(request.user) or len(teams_of(request.user) or ()) > 1}
    return render(request, PAGE, context, status=status)


def _summary(route: Route) -> dict:
    """A route as its row shows it: each branch's share of its requests, in percent."""
    branches = list(route.branches.all())
    total = sum(b.weight for b in branches) or 1
    return {"name": route.name, "team": route.team.name, "updated": route.updated,
            "fallback": route.fallback.name if route.fallback_id else "",
            "branches": [{"target": b.target, "deployment": b.deployment.name, "weight": b.weight,
                          "percent": f"{100 * b.weight / total:.4g}"} for b in branches]}


def _refused(request, form: RouteForm, error: DomainError, route: Route | None = None):
    """The form again with the reason beside its input: the card alone for htmx (swapped in place), else the page
    with the refusal's status."""
    form.refused(error)
    if request.htmx:
        return render_partial_or_full(request, FORM, _form_context(request, form, route))
    if route is None:
        return _listed(request, form, error.status)
    return render(request, EDIT, _form_context(request, form, route), status=error.status)


def _done(request, message: str, to: str):
    messages.success(request, message)
    return HttpResponseClientRedirect(to) if request.htmx else redirect(to)


@login_required_htmx
@require_http_methods(["GET", "HEAD", "POST"])
def routes_page(request):
    """The list and the create form (GET); POST creates a route from the form."""
    if request.method != "POST":
        return _listed(request, blank())
    form = submitted(request.POST)
    try:
        team = creation_team(request.user, form.team) if form.team else None  # else its first branch's
        route = services.create_route(form.name, branches_of(form), form.fallback or None, actor=actor_of(request),
                                      team=team, teams=teams_of(request.user))
    except DomainError as e:
        return _refused(request, form, e)
    # htmx sends the browser to the list without the anchor: from /routes/ itself, a change of anchor alone would
    # only scroll, not load the page again.
    to = reverse("routes") + ("" if request.htmx else f"#route-{route.name}")
    return _done(request, f"Route {route.name} created: {_described(route)}. The gateways send requests by it "
                 "within a second.", to)


def _route(request, name: str) -> Route:
    """One of the viewer's teams' routes; another team's is a 404, as a name nobody has."""
    try:
        return services.get_route(name, teams_of(request.user))
    except NotFound as e:
        raise Http404(str(e)) from None


def _described(route: Route) -> str:
    return services.describe(route, list(route.branches.select_related("deployment", "adapter")))


@login_required_htmx
@require_http_methods(["GET", "HEAD", "POST"])
def edit(request, name: str):
    """A route's page: its branches and fallback in a form (GET), saved by POST; its name and team stay."""
    route = _route(request, name)
    if request.method != "POST":
        return render(request, EDIT, _form_context(request, stored(route), route))
    form = submitted(request.POST)
    form.name, form.team = route.name, route.team.name
    try:
        route = services.update_route(name, {"branches": branches_of(form), "fallback": form.fallback or None},
                                      actor=actor_of(request), teams=teams_of(request.user))
    except DomainError as e:
        return _refused(request, form, e, route)
    return _done(request, f"Route {name} changed: {_described(route)}. The gateways follow within a second.",
                 reverse("routes") + f"#route-{name}")


@login_required
@require_POST
def delete(request, name: str):
    _route(request, name)
    services.delete_route(name, actor=actor_of(request), teams=teams_of(request.user))
    messages.success(request, f"Route {name} deleted: its name no longer routes requests.")
    return redirect("routes")


@login_required_htmx
@require_safe
def branch_row(request):
    """One more empty branch row for the form (its "Add a branch" button)."""
    targets = target_choices(teams_of(request.user))
    return render(request, ROW, {"row": {"target": "", "weight": "1"}, "targets": targets, "max_weight": MAX_WEIGHT})
