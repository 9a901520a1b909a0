"""The usage page: what requests cost over a range, per team, key and model, as the reader's teams may see."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.accounts.scope import TeamScope
from console.usage.page import model_key, range_key, table_key, usage_page


@login_required
@require_safe
def usage(request):
    scope = TeamScope.of(request.user)
    page = usage_page(scope, range_key(request.GET.get("range")), table_key(request.GET.get("by")),
                      model=model_key(request.GET.get("model")))
    return render(request, "usage/page.html", {"page": page, "teams_only": not scope.everything})
