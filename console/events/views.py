"""The events page (the whole timeline, filtered, a page at a time) and the recent-events fragment the
deployment and host pages poll."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_safe

from console.accounts.scope import TeamScope
from console.errors import Invalid
from console.events.models import EventType
from console.events.query import EventFilter, page
from console.events.templatetags.timeline import recent_of

PER_PAGE = 50
REASONS = ("Placed", "Moved", "Woken", "Slept", "Preempted", "Stopped", "Refused", "Scaled", "Starting", "Loading",
           "Ready", "Woke", "Asleep", "Failed", "OutOfMemory", "HeartbeatTimeout", "Restarted", "Connected",
           "Disconnected", "Unknown", "Reconnected", "Evicted", "Created", "PolicyChanged", "Deleted", "Registered",
           "TokenCreated", "TokenRotated", "AlertFiring", "AlertResolved", "WebhookDelivered", "WebhookFailed")


@login_required
@require_safe
def events_page(request):
    """Filters are plain GET parameters, so every view of the timeline is a link; a bad one is shown, never a 500."""
    q = request.GET
    f = EventFilter(object=q.get("object", "").strip()[:300], type=q.get("type", "") if q.get("type") in
                    EventType.values else "", reason=q.get("reason", "").strip()[:40])
    cursor = q.get("cursor", "")[:200]
    error = None
    try:
        events, following = page(f, TeamScope.of(request.user), cursor, PER_PAGE)
    except Invalid as e:
        events, following, error = [], None, str(e)
    context = {"events": events, "next": following, "filters": f, "cursor": cursor, "error": error,
               "types": EventType.values, "reasons": REASONS,
               "live": not cursor}  # the first page follows new events; older pages stay put
    response = render(request, "events/_table.html" if request.htmx else "events/page.html", context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@require_safe
def recent(request):
    """The last events of one object (?object=deployment/NAME), for a page's live card."""
    key = request.GET.get("object", "")[:300]
    try:
        context = recent_of(key, TeamScope.of(request.user))
    except Invalid as e:
        context = {"events": [], "error": str(e), "object_key": key}
    return render(request, "events/_list.html", context)
