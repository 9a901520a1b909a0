from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from console.deployments.models import Deployment
from console.deployments.presenters import deployment_row, heading_for, load_progress
from console.fleet.presenters import fleet
from console.fleet.templatetags.units import gib

# One line per strategy for the dashboard's "how placement is decided" note (docs/placement.md has the rest).
STRATEGY_SUMMARIES = {
    "fill-first": "packs each replica onto the fullest GPU already in use that fits, so the fewest GPUs are busy",
    "balance": "puts each replica on the GPU with the most free memory, spreading load across hosts",
    "memory-optimized": "best fit (the GPU a replica fits most tightly), then a short search that repacks new "
                        "replicas when some do not fit",
    "latency-sensitive": "gives latency-critical replicas a GPU of their own or a complementary neighbour, and "
                         "packs the rest onto GPUs in use",
}


def _segments(gpu: dict) -> dict:
    """Bar geometry in percent of the GPU's total: one segment per replica, then foreign use."""
    total = gpu["total_bytes"] or 1
    segments = []
    for r in gpu["replicas"]:
        width = max(100 * r["reserved_bytes"] / total, 0.8)  # keep tiny replicas visible
        fill = 100 * (r["measured_bytes"] or 0) / (r["reserved_bytes"] or 1)
        progress = load_progress(r["state"], r["loaded_bytes"], r["loading_total_bytes"])
        toward = heading_for(r["state"], r["desired_state"])
        segments.append(r | {"width": round(width, 3), "fill": round(min(fill, 100), 1), "progress": progress,
                             "toward": toward, "tooltip": _tooltip(r, progress, toward),
                             "labelled": width >= _label_percent(r["deployment"])})
    ours = sum(r["measured_bytes"] or 0 for r in gpu["replicas"])
    foreign = max(gpu["used_bytes"] - ours, 0)
    return gpu | {
        "segments": segments,
        "foreign_bytes": foreign,
        "foreign_width": round(100 * foreign / total, 3),
        "reserved_pct": round(100 * gpu["reserved_bytes"] / total, 1),
    }


def _label_percent(name: str) -> float:
    """The share of a 1,100-pixel bar (the dashboard at its usual width) a segment needs to show `name`;
    narrower ones rely on their tooltip and the legend."""
    return (7 * len(name) + 14) / 11


def _tooltip(r: dict, progress: int | None, toward: str | None) -> str:
    """What a segment says on hover: which replica, doing what, how much memory, and why it is there."""
    state = r["state"] + (f" {progress}%" if progress is not None else "") + (f" → {toward}" if toward else "")
    parts = [f"{r['deployment']}#{r['index']}", state, f"reserved {gib(r['reserved_bytes'])}",
             f"measured {gib(r['measured_bytes'])}"]
    if r["mps_percentage"]:
        parts.append(f"MPS {r['mps_percentage']}% of SMs")
    if r["action"] or r["reason"]:
        parts.append(": ".join(p for p in (r["action"], r["reason"]) if p))
    return " · ".join(parts)


def scheduler_context() -> dict:
    strategy = settings.MODELGRID_STRATEGY
    return {
        "strategy": strategy,
        "summary": STRATEGY_SUMMARIES.get(strategy, ""),
        "quiet_window_min": round(settings.MODELGRID_QUIET_WINDOW_SECONDS / 60, 1),
        "cooldown_min": round(settings.MODELGRID_SCALE_COOLDOWN_SECONDS / 60, 1),
    }


def grid_context() -> dict:
    hosts = [h | {"gpus": [_segments(g) for g in h["gpus"]]} for h in fleet()]
    deployments = Deployment.objects.select_related("model").prefetch_related("replica_set")
    return {"hosts": hosts, "deployments": [deployment_row(d) for d in deployments]}


@login_required
def dashboard(request):
    return render(request, "fleet/dashboard.html", grid_context() | {"scheduler": scheduler_context()})
