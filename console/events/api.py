from ninja import Query, Router

from console.accounts.teams import teams_of
from console.catalog.schemas import ErrorOut
from console.events.query import EventFilter, page, parse_since
from console.events.schemas import EventPage, EventQuery

router = Router()


@router.get("", response={200: EventPage, 422: ErrorOut},
            summary="The event timeline, newest first, a page at a time (follow `next`)")
def list_events(request, query: Query[EventQuery]):
    f = EventFilter(object=query.object, type=query.type, reason=query.reason, since=parse_since(query.since))
    events, following = page(f, query.cursor, query.limit, teams=teams_of(request.user))
    return {"events": [as_item(e) for e in events], "next": following}


def as_item(e) -> dict:
    return {"time": e.last_seen, "first_time": e.first_seen, "object": e.object, "type": e.type,
            "reason": e.reason, "message": e.message, "count": e.count, "actor": e.actor}
