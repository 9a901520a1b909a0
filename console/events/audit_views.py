"""The audit page: who changed what (console/events/audit.py), filtered by plain GET parameters so every view of
it is a link, a page at a time. A bad filter is said on the page, never a 500."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.accounts.scope import TeamScope
from console.errors import Invalid
from console.events.audit import KINDS, audit_filter, audited
from console.events.models import Event
from console.pagination import page_number, page_within, pager

PER_PAGE = 50
PARAMS = ("who", "kind", "since", "until")


@login_required
@require_safe
def audit_page(request):
    asked = {p: request.GET.get(p, "").strip()[:150] for p in PARAMS}
    number, note = page_number(request.GET)
    notes, rows = [note], Event.objects.none()
    try:
        rows = audited(audit_filter(**asked), TeamScope.of(request.user))
    except Invalid as e:
        notes.append(str(e))
    found, window, past = page_within(rows, number, PER_PAGE)
    return render(request, "events/audit.html", {
        "events": window, "pager": pager(found, request.GET), "notes": [n for n in (*notes, past) if n],
        "filters": asked, "kinds": KINDS, "filtered": any(asked.values())})
