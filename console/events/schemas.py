from datetime import datetime
from typing import Literal

from ninja import Field, Schema

from console.events.query import DEFAULT_LIMIT, MAX_LIMIT


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
