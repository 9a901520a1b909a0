from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.accounts.teams import teams_of
from console.alerts.evaluate import open_alerts


@login_required
@require_safe
def banner(request):
    """The dashboard's alert banner, polled."""
    return render(request, "alerts/_banner.html", {"alerts": open_alerts(teams_of(request.user))})
