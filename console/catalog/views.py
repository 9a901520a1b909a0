from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.accounts.auth import actor_of
from console.accounts.scope import TeamScope
from console.accounts.teams import creation_team, teams_of, visible_teams
from console.catalog import adapters, memory, services
from console.catalog.calibration import error_fraction
from console.catalog.models import Calibration
from console.errors import DomainError, NotFound
from console.fleet.templatetags.units import gib
from console.forms import whole_number


@login_required
def models_page(request):
    scope = TeamScope.of(request.user)
    return render(
        request,
        "catalog/models.html",
        {
            # A store directory another team registered says so, without its name (console/accounts/scope.py).
            "all_teams": scope.everything,
            "team_ids": scope.teams or frozenset(),
            # Members of several teams (and admins) say which owns what they register.
            "team_choices": list(visible_teams(request.user).values_list("name", flat=True)),
            "entries": services.model_store_entries(),
            "models": scope.models().prefetch_related(Prefetch("deployments", queryset=scope.deployments())),
            "store": settings.MODEL_STORE,
            "dtypes": memory.WORKER_DTYPES,
            # Corrections per architecture family are every team's (a figure, no name); the loads behind them are
            # each their own team's.
            "calibrations": Calibration.objects.all(),
            "samples": [
                {"sample": s, "error": error_fraction(s.estimated_bytes, s.measured_bytes),
                 "calibrated_error": error_fraction(s.calibrated_bytes, s.measured_bytes)}
                for s in scope.samples()[:10]
            ],
        },
    )


@login_required
@require_POST
def estimate_preview(request):
    """The breakdown for the registration and deploy forms (an htmx fragment); errors are shown, not raised."""
    form = request.POST
    try:
        result = services.estimate_request(
            form.get("path", "").strip() or None,
            form.get("model", "").strip() or None,
            form.get("dtype") or None,
            whole_number(form.get("batch"), "batch") or 1,
            whole_number(form.get("seq"), "seq"),
            form.get("device") or "cuda",
            teams=teams_of(request.user),
        )
    except DomainError as e:
        return render(request, "catalog/_estimate.html", {"error": str(e)})
    return render(request, "catalog/_estimate.html", {"e": result})


@login_required
@require_POST
def register(request):
    name, path = request.POST.get("name", "").strip(), request.POST.get("path", "").strip()
    try:
        model = services.register_model(name, path, actor=actor_of(request),
                                        team=creation_team(request.user, request.POST.get("team") or None))
    except DomainError as e:
        messages.error(request, f"Not registered: {e}")
    else:
        e = model.estimate
        messages.success(
            request,
            f"Registered {model.name}: {model.parameters:,} parameters; one replica on a GPU needs about "
            f"{gib(model.estimate_bytes)} ({e['dtype']}, batch {e['batch']}, seq {e['seq']}: weights "
            f"{gib(e['weights_bytes'])}, KV cache {gib(e['kv_cache_bytes'])}, activations "
            f"{gib(e['activation_bytes'])}, runtime {gib(e['overhead_bytes'])}).",
        )
    return redirect("models")


@login_required
@require_POST
def edit_model(request, name: str):
    """A new directory for a model, or the same one read again (services.update_model)."""
    try:
        before = services.get_model(name, teams=teams_of(request.user))
    except NotFound as e:
        raise Http404(str(e)) from None
    try:
        model = services.update_model(name, request.POST.get("path", "").strip(), actor=actor_of(request),
                                      teams=teams_of(request.user))
    except DomainError as e:
        messages.error(request, f"Not changed: {e}")
    else:
        if model.fingerprint == before.fingerprint and model.path == before.path:
            messages.info(request, f"Model {name}: its files are as they were; nothing changed.")
        else:
            users = list(model.deployments.values_list("name", flat=True))
            messages.success(request, f"Model {name} changed: {model.parameters:,} parameters, about "
                             f"{gib(model.estimate_bytes)} a replica" + (f"; {', '.join(users)} restart onto it one "
                                                                          "replica at a time" if users else "") + ".")
    return redirect("models")


@login_required
@require_POST
def edit_adapter(request, adapter: str):
    """A new directory for an adapter (or the same one read again) and its pin (adapters.update_adapter)."""
    try:
        deployment = adapters.get_adapter(adapter, teams_of(request.user)).deployment.name
    except NotFound as e:
        raise Http404(str(e)) from None
    form = request.POST
    changes = {"pinned": bool(form.get("pinned"))}
    if form.get("path", "").strip():
        changes["path"] = form["path"].strip()
    try:
        row = adapters.update_adapter(adapter, changes, actor=actor_of(request), teams=teams_of(request.user))
    except DomainError as e:
        messages.error(request, f"Adapter not changed: {e}")
    else:
        messages.success(request, f"Adapter {adapter} changed (rank {row.rank}, {row.nbytes:,} bytes"
                         f"{', pinned' if row.pinned else ''}); a new directory restarts the deployment's replicas "
                         "onto it one at a time.")
    return redirect("deployment", deployment)
