from __future__ import annotations

from functools import wraps
from urllib.parse import urlencode

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render, resolve_url
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect

import agent.engines as engines
from console.accounts.auth import actor_of
from console.accounts.teams import scoped, teams_of
from console.catalog import adapters
from console.deployments import services
from console.deployments.models import Deployment, Priority, Profile
from console.deployments.policy_form import (
    describe_changes,
    parse_policy_form,
    policy_values,
    stored_policy,
    submitted_values,
)
from console.deployments.presenters import deployment_page_data
from console.errors import DomainError, NotFound
from console.fleet.logs import replica_logs

PAGE = "deployments/detail.html"
STATUS = "deployments/_status.html"
POLICY = "deployments/_policy.html"
LOG_TAIL = "deployments/_log_tail.html"
LOG_LINES = 200  # the page's tail of a replica's log
# htmx stops polling when a poll answers 286 (the deployment was deleted meanwhile).
STOP_POLLING = 286
PROFILES = [(Profile.UNKNOWN, "unknown"), (Profile.COMPUTE, "compute-bound"), (Profile.MEMORY, "memory-bound"),
            (Profile.IO, "I/O-bound")]
ENGINES = [(engines.AUTO, engines.AUTO_LABEL),
           *((e.name, f"{e.label} ({'built in' if e is engines.BUILTIN else 'only on hosts that run it'})")
             for e in engines.ENGINES.values())]
SPREADS = [("preferred", "preferred (apart unless they cannot)"), ("required", "required (never two on one GPU)"),
           ("none", "none (as the strategy packs them)")]


def login_required_htmx(view):
    """login_required; but an htmx request without a session (signed out in another tab) sends the whole
    browser to the login page, instead of having the login form swapped into a fragment."""
    guarded = login_required(view)
    if iscoroutinefunction(view):
        @wraps(view)
        async def async_wrapper(request, *args, **kwargs):
            if request.htmx and not (await request.auser()).is_authenticated:
                back = request.htmx.current_url_abs_path or request.get_full_path()
                return HttpResponseClientRedirect(f"{resolve_url(settings.LOGIN_URL)}?{urlencode({'next': back})}")
            return await guarded(request, *args, **kwargs)

        return async_wrapper

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.htmx and not request.user.is_authenticated:
            back = request.htmx.current_url_abs_path or request.get_full_path()
            return HttpResponseClientRedirect(f"{resolve_url(settings.LOGIN_URL)}?{urlencode({'next': back})}")
        return guarded(request, *args, **kwargs)

    return wrapper


def render_partial_or_full(request, fragment: str, context: dict, full: str = PAGE) -> HttpResponse:
    """The fragment alone for an htmx request, else the whole page; cached apart by HX-Request."""
    response = render(request, fragment if request.htmx else full, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _deployment(request, name: str) -> Deployment:
    """The deployment, if it is one of the user's teams' (console/accounts/teams.py); else 404, as for none."""
    try:
        return services.get_deployment(name, teams=teams_of(request.user))
    except NotFound as e:
        raise Http404(str(e)) from None


def _context(dep: Deployment, **policy) -> dict:
    return {
        "d": deployment_page_data(dep),
        "policy": policy.get("values") or policy_values(dep),
        "policy_error": policy.get("error"),
        "policy_error_field": policy.get("error_field"),
        "policy_saved": policy.get("saved"),
        "priorities": Priority.values,
        "profiles": PROFILES,
        "engines": ENGINES,
        "spreads": SPREADS,
    }


@login_required
@require_safe
def deployment_page(request, name: str):
    return render(request, PAGE, _context(_deployment(request, name)))


@login_required_htmx
@require_safe
def status(request, name: str):
    """The live part of the deployment page (state, SLO, replicas), polled by the page every 2 s."""
    try:
        dep = services.get_deployment(name, teams=teams_of(request.user))
    except NotFound:
        if request.htmx:
            return render(request, "deployments/_gone.html", {"name": name}, status=STOP_POLLING)
        raise Http404(f"no deployment named {name!r}") from None
    context = _context(dep)
    # The page sends what its log picker lists and the replica chosen; a picker gone stale comes back drawn again.
    shown = request.GET.get("log_options")
    if shown is not None and shown != context["d"]["log_options"]:
        context |= {"logs_oob": True, "log_replica": _index(request.GET.get("replica"))}
    return render_partial_or_full(request, STATUS, context)


def _index(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@login_required_htmx
@require_safe
async def replica_log(request, name: str):
    """The worker logs card's tail: the last lines of the replica chosen (?replica=INDEX), or the refusal that says
    why there are none; polled by the page every 2 s. Async: it waits up to 5 s for the replica's agent."""
    index = _index(request.GET.get("replica", "0"))
    if index is None:
        index = -1  # no replica has it: refused below like any other index that does not exist
    def mine() -> bool:  # another team's deployment is as gone as a deleted one
        return scoped(Deployment.objects.filter(name=name), teams_of(request.user)).exists()

    if not await sync_to_async(mine)():
        return HttpResponse(render_to_string("deployments/_gone.html", {"name": name}), status=STOP_POLLING)
    try:
        lines, error = await replica_logs(name, index, LOG_LINES), ""
    except DomainError as e:
        if isinstance(e, NotFound) and not await sync_to_async(Deployment.objects.filter(name=name).exists)():
            return HttpResponse(render_to_string("deployments/_gone.html", {"name": name}), status=STOP_POLLING)
        lines, error = [], str(e)
    return HttpResponse(render_to_string(LOG_TAIL, {"lines": lines, "error": error, "index": index}))


@login_required_htmx
@require_POST
def update_policy(request, name: str):
    """Save the policy form. htmx: the card again, with the outcome inside it (and the status refreshed
    out of band); without JavaScript: back to the page with the outcome as a message."""
    dep = _deployment(request, name)
    before = stored_policy(dep)
    try:
        dep = services.update_deployment(name, parse_policy_form(request.POST), actor=actor_of(request),
                                         teams=teams_of(request.user))
    except DomainError as e:
        error, error_field, saved = str(e), (e.fields or [None])[0], None
    else:
        changes = describe_changes(before, dep)
        error = error_field = None
        saved = ("Saved: " + "; ".join(changes) + ". The scheduler acts on it at its next pass."
                 if changes else "Nothing changed.")
    if request.htmx:
        context = _context(dep, error=error, error_field=error_field, saved=saved,
                           values=submitted_values(request.POST) if error else None)
        response = render(request, POLICY, context | {"oob": True})
        patch_vary_headers(response, ("HX-Request",))
        return response
    if error:
        messages.error(request, f"Policy not saved: {error}. Nothing was changed.")
    else:
        messages.success(request, saved)
    return redirect(reverse("deployment", args=[name]) + "#policy")


@login_required
@require_POST
def delete(request, name: str):
    _deployment(request, name)  # 404 unless it is one of the user's teams'
    services.delete_deployment(name, actor=actor_of(request), teams=teams_of(request.user))
    messages.success(request, f"Deployment {name} deleted; its workers are being stopped.")
    return redirect("dashboard")


@login_required
@require_POST
def register_adapter(request, name: str):
    form = request.POST
    try:
        adapter = adapters.register_adapter(form.get("name", "").strip(), name, form.get("path", "").strip(),
                                            pinned=bool(form.get("pinned")), actor=actor_of(request),
                                            teams=teams_of(request.user))
    except DomainError as e:
        messages.error(request, f"Adapter not added: {e}")
    else:
        messages.success(request, f"Adapter {adapter.name} added (rank {adapter.rank}, {adapter.nbytes:,} bytes).")
    return redirect("deployment", name)


@login_required
@require_POST
def delete_adapter(request, adapter: str):
    try:
        deployment = adapters.get_adapter(adapter, teams_of(request.user)).deployment.name
    except NotFound as e:
        raise Http404(str(e)) from None
    adapters.delete_adapter(adapter, actor=actor_of(request), teams=teams_of(request.user))
    messages.success(request, f"Adapter {adapter} removed.")
    return redirect("deployment", deployment)
