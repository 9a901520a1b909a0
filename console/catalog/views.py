from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.catalog import services
from console.catalog.models import Model
from console.deployments.services import create_deployment, unused_deployment_name
from console.errors import DomainError


@login_required
def models_page(request):
    return render(
        request,
        "catalog/models.html",
        {
            "entries": services.model_store_entries(),
            "models": Model.objects.prefetch_related("deployments"),
            "store": settings.MODEL_STORE,
        },
    )


@login_required
@require_POST
def register(request):
    name, path = request.POST.get("name", "").strip(), request.POST.get("path", "").strip()
    try:
        model = services.register_model(name, path)
    except DomainError as e:
        messages.error(request, f"Not registered: {e}")
    else:
        estimate = model.estimate_bytes / 2**20
        messages.success(request, f"Registered {model.name}: estimated {estimate:.1f} MiB per replica.")
    return redirect("models")


@login_required
@require_POST
def deploy(request, name: str):
    try:
        dep_name = request.POST.get("deployment") or unused_deployment_name(name)
        dep = create_deployment(dep_name, name, int(request.POST.get("replicas", 1)))
    except (DomainError, ValueError) as e:
        messages.error(request, f"Not deployed: {e}")
        return redirect("models")
    messages.success(request, f"Deployment {dep.name} created; the scheduler is placing it.")
    return redirect("deployment", dep.name)
