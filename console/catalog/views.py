from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.catalog import memory, services
from console.catalog.calibration import error_fraction
from console.catalog.models import Calibration, MemorySample, Model
from console.deployments.services import create_deployment, unused_deployment_name
from console.errors import DomainError, Invalid


@login_required
def models_page(request):
    return render(
        request,
        "catalog/models.html",
        {
            "entries": services.model_store_entries(),
            "models": Model.objects.prefetch_related("deployments"),
            "store": settings.MODEL_STORE,
            "dtypes": memory.WORKER_DTYPES,
            "calibrations": Calibration.objects.all(),
            "samples": [
                {"sample": s, "error": error_fraction(s.estimated_bytes, s.measured_bytes),
                 "calibrated_error": error_fraction(s.calibrated_bytes, s.measured_bytes)}
                for s in MemorySample.objects.all()[:10]
            ],
        },
    )


@login_required
@require_POST
def estimate_preview(request):
    """The breakdown for the registration and deploy forms (an htmx fragment); errors are shown, not raised."""
    form = request.POST
    try:
        result = memory.estimate_request(
            form.get("path", "").strip() or None,
            form.get("model", "").strip() or None,
            form.get("dtype") or None,
            _int(form.get("batch"), "batch") or 1,
            _int(form.get("seq"), "seq"),
            form.get("device") or "cuda",
        )
    except DomainError as e:
        return render(request, "catalog/_estimate.html", {"error": str(e)})
    return render(request, "catalog/_estimate.html", {"e": result})


def _int(text: str | None, field: str) -> int | None:
    if not text or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise Invalid(f"{field} must be a whole number, got {text!r}") from None


@login_required
@require_POST
def register(request):
    name, path = request.POST.get("name", "").strip(), request.POST.get("path", "").strip()
    try:
        model = services.register_model(name, path)
    except DomainError as e:
        messages.error(request, f"Not registered: {e}")
    else:
        e = model.estimate
        messages.success(
            request,
            f"Registered {model.name}: {model.parameters:,} parameters; one replica on a GPU needs about "
            f"{_mib(model.estimate_bytes)} ({e['dtype']}, batch {e['batch']}, seq {e['seq']}: weights "
            f"{_mib(e['weights_bytes'])}, KV cache {_mib(e['kv_cache_bytes'])}, activations "
            f"{_mib(e['activation_bytes'])}, runtime {_mib(e['overhead_bytes'])}).",
        )
    return redirect("models")


@login_required
@require_POST
def deploy(request, name: str):
    form = request.POST
    try:
        dep_name = form.get("deployment") or unused_deployment_name(name)
        dep = create_deployment(dep_name, name, _int(form.get("replicas"), "replicas") or 1,
                                form.get("priority") or "standard", dtype=form.get("dtype") or None,
                                batch=_int(form.get("batch"), "batch") or 1, seq=_int(form.get("seq"), "seq"))
    except DomainError as e:
        messages.error(request, f"Not deployed: {e}")
        return redirect("models")
    messages.success(request, f"Deployment {dep.name} created; the scheduler is placing it.")
    return redirect("deployment", dep.name)


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
