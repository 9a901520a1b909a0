"""The charts fragments the deployment page, the host page and the dashboard poll every 10 s (and swap on a
range change)."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_safe

from console.accounts.scope import TeamScope
from console.deployments.views import STOP_POLLING, login_required_htmx
from console.series.panels import deployment_panel, fleet_panel, host_panel, range_key

FRAGMENT, GONE = "series/_charts.html", "series/_gone.html"


def _gone(request, what: str, panel_id: str):
    """Htmx: a note, and the polling stops; a browser without it asked for a page that is not there."""
    if not request.htmx:
        raise Http404(what)
    return render(request, GONE, {"what": what, "id": panel_id}, status=STOP_POLLING)


def _fragment(request, panel: dict, page: str):
    """The charts section for htmx; a browser without it goes to the page, at the charts, in that range."""
    if not request.htmx:
        return redirect(f"{page}?range={panel['range']}#{panel['id']}")
    response = render(request, FRAGMENT, {"panel": panel})
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required_htmx
@require_safe
def deployment_charts(request, name: str):
    panel = deployment_panel(name, range_key(request.GET.get("range")), TeamScope.of(request.user))
    if panel is None:  # deleted meanwhile, or another team's (as missing as none)
        return _gone(request, f"Deployment {name} was deleted", "charts")
    return _fragment(request, panel, reverse("deployment", args=[name]))


@login_required_htmx
@require_safe
def host_charts(request, name: str):
    panel = host_panel(name, range_key(request.GET.get("range")))
    if panel is None:
        return _gone(request, f"Host {name} is gone", "host-charts")
    return _fragment(request, panel, reverse("host", args=[name]))


@login_required_htmx
@require_safe
def fleet_charts(request):
    return _fragment(request, fleet_panel(range_key(request.GET.get("range")), TeamScope.of(request.user)),
                     reverse("dashboard"))
