from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.deployments import services
from console.deployments.presenters import deployment_data


@login_required
def deployment_page(request, name: str):
    return render(request, "deployments/detail.html", {"d": deployment_data(services.get_deployment(name))})


@login_required
@require_POST
def delete(request, name: str):
    services.delete_deployment(name)
    messages.success(request, f"Deployment {name} deleted; its workers are being stopped.")
    return redirect("dashboard")
