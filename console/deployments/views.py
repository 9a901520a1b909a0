from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.catalog import adapters
from console.deployments import services
from console.deployments.presenters import deployment_data
from console.errors import DomainError


@login_required
def deployment_page(request, name: str):
    return render(request, "deployments/detail.html", {"d": deployment_data(services.get_deployment(name))})


@login_required
@require_POST
def delete(request, name: str):
    services.delete_deployment(name)
    messages.success(request, f"Deployment {name} deleted; its workers are being stopped.")
    return redirect("dashboard")


@login_required
@require_POST
def register_adapter(request, name: str):
    form = request.POST
    try:
        adapter = adapters.register_adapter(form.get("name", "").strip(), name, form.get("path", "").strip(),
                                            pinned=bool(form.get("pinned")))
    except DomainError as e:
        messages.error(request, f"Adapter not added: {e}")
    else:
        messages.success(request, f"Adapter {adapter.name} added (rank {adapter.rank}, {adapter.nbytes:,} bytes).")
    return redirect("deployment", name)


@login_required
@require_POST
def delete_adapter(request, adapter: str):
    deployment = adapters.get_adapter(adapter).deployment.name
    adapters.delete_adapter(adapter)
    messages.success(request, f"Adapter {adapter} removed.")
    return redirect("deployment", deployment)
