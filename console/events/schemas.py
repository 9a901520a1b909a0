from datetime import datetime
from typing import Literal

from ninja import Field, Schema

from console.events.audit import KINDS
from console.events.query import DEFAULT_LIMIT, MAX_LIMIT
from console.pagination import DEFAULT_PER_PAGE, MAX_PAGE, MAX_PER_PAGE


class EventQuery(Schema):
    object: str = Field("", max_length=300, description="deployment/NAME (with its replicas' events), "
                        "host/NAME (with its replicas' there), replica/NAME#INDEX, model/NAME, adapter/NAME, "
                        "route/NAME, token/USER/NAME")
    type: Literal["Normal", "Warning", ""] = Field("", description="Normal or Warning")
    reason: str = Field("", max_length=40, description="a reason code: Placed, Preempted, Failed, ...")
    since: str = Field("", max_length=40, description="only events last seen at or after this: unix seconds or "
                       "ISO 8601")
    cursor: str = Field("", max_length=200, description="the `next` of the previous page")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=f"events per page, at most {MAX_LIMIT}")


class EventOut(Schema):
    time: datetime = Field(description="when it last happened")
    first_time: datetime = Field(description="when it first happened (repeats are folded into one event)")
    object: str
    type: str = Field(description="Normal or Warning")
    reason: str
    message: str
    count: int = Field(description="how many times it happened between first_time and time")
    actor: str = Field(description="who did it: scheduler, console, agent HOST, user NAME, token NAME (user)")


class EventPage(Schema):
    events: list[EventOut]
    next: str | None = Field(description="the cursor of the next (older) page; null on the last")


class AuditQuery(Schema):
    who: str = Field("", max_length=150, description="a user name: their changes, made in a session or with any of "
                     "their tokens")
    kind: str = Field("", max_length=40, description="what was changed: " + ", ".join(KINDS))
    since: str = Field("", max_length=40, description="only changes at or after this: unix seconds or ISO 8601")
    until: str = Field("", max_length=40, description="only changes at or before this: unix seconds or ISO 8601")
    page: int = Field(1, ge=1, le=MAX_PAGE, description="which page, from 1; past the last page the list is empty")
    per_page: int = Field(DEFAULT_PER_PAGE, ge=1, le=MAX_PER_PAGE, description=f"rows per page, at most {MAX_PER_PAGE}")
