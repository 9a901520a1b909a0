from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.accounts.scope import TeamScope
from console.alerts.evaluate import open_alerts


@login_required
@require_safe
def banner(request):
    """The dashboard's alert banner, polled."""
    return render(request, "alerts/_banner.html", {"alerts": open_alerts(TeamScope.of(request.user))})
