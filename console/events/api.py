from django.http import HttpResponse
from ninja import Query, Router

from console.accounts.scope import TeamScope
from console.catalog.schemas import ErrorOut
from console.events.audit import audit_filter, audited
from console.events.query import EventFilter, page, parse_since
from console.events.schemas import AuditQuery, EventOut, EventPage, EventQuery
from console.pagination import paginate, set_page_headers

router = Router()
audit_router = Router()


@router.get("", response={200: EventPage, 422: ErrorOut},
            summary="The event timeline, newest first, a page at a time (follow `next`)")
def list_events(request, query: Query[EventQuery]):
    f = EventFilter(object=query.object, type=query.type, reason=query.reason, since=parse_since(query.since))
    events, following = page(f, TeamScope.of(request.user), query.cursor, query.limit)
    return {"events": [as_item(e) for e in events], "next": following}


@audit_router.get("", response={200: list[EventOut], 422: ErrorOut},
                  summary="Who changed what: the changes people and their tokens made, newest first, of your teams' "
                  "objects (all for admins), a page at a time (X-Total-Count and Link headers)")
def list_audit(request, response: HttpResponse, query: Query[AuditQuery]):
    f = audit_filter(query.who, query.kind, query.since, query.until)
    found, window = paginate(audited(f, TeamScope.of(request.user)), query.page, query.per_page)
    set_page_headers(response, request, found)
    return [as_item(e) for e in window]


def as_item(e) -> dict:
    return {"time": e.last_seen, "first_time": e.first_seen, "object": e.object, "type": e.type,
            "reason": e.reason, "message": e.message, "count": e.count, "actor": e.actor}
