from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from console.deployments.models import Deployment
from console.fleet.presenters import fleet


def _segments(gpu: dict) -> dict:
    """Bar geometry in percent of the GPU's total: one segment per replica, then foreign use."""
    total = gpu["total_bytes"] or 1
    segments = []
    for r in gpu["replicas"]:
        width = max(100 * r["reserved_bytes"] / total, 0.8)  # keep tiny replicas visible
        fill = 100 * (r["measured_bytes"] or 0) / (r["reserved_bytes"] or 1)
        segments.append(r | {"width": round(width, 3), "fill": round(min(fill, 100), 1)})
    ours = sum(r["measured_bytes"] or 0 for r in gpu["replicas"])
    foreign = max(gpu["used_bytes"] - ours, 0)
    return gpu | {
        "segments": segments,
        "foreign_bytes": foreign,
        "foreign_width": round(100 * foreign / total, 3),
        "reserved_pct": round(100 * gpu["reserved_bytes"] / total, 1),
    }


def grid_context() -> dict:
    hosts = [h | {"gpus": [_segments(g) for g in h["gpus"]]} for h in fleet()]
    return {
        "hosts": hosts,
        "deployments": Deployment.objects.select_related("model").prefetch_related("replica_set"),
    }


@login_required
def dashboard(request):
    return render(request, "fleet/dashboard.html", grid_context())
