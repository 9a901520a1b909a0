"""Usage through the API: `GET /usage` (totals and a series per team, token or deployment) and `GET /usage.csv`
(one row per step and group), both narrowed to the teams the caller acts within."""

from __future__ import annotations

import csv
import io
import time
from datetime import UTC, datetime
from typing import Literal

from django.http import HttpResponse
from ninja import Field, Query, Router, Schema

from console.accounts.scope import TeamScope
from console.catalog.schemas import ErrorOut
from console.errors import Invalid
from console.series.api import parse_since
from console.usage.report import COUNTS, Report, refused, report

router = Router()
csv_router = Router()
AUTO_STEPS = (60, 300, 900, 3600, 21600, 86400)
AUTO_POINTS = 240  # an automatic step gives about this many steps at most
DAY = 86400
EARLIEST = 0  # the times a query may name: 1970-01-01T00:00:00Z ...
LATEST = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())  # ... to 9999-12-31T23:59:59Z


class UsageQuery(Schema):
    group: Literal["team", "token", "deployment"] = Field("team", description="what each series is of")
    since: str | None = Field(None, max_length=40, description="unix seconds or ISO 8601 (no offset: UTC); "
                              "default a day before `until`")
    until: str | None = Field(None, max_length=40, description="the range's end (excluded); default now")
    step: int | None = Field(None, ge=60, le=31 * DAY, description="seconds per point, a whole number of "
                             "minutes; default: the shortest of 1 min, 5 min, 15 min, 1 h, 6 h, 1 day that gives "
                             f"at most {AUTO_POINTS} points")
    team: str | None = Field(None, max_length=63, description="only this team's usage")
    deployment: str | None = Field(None, max_length=63, description="only this deployment's usage")


class CountsOut(Schema):
    requests: int
    errors: int = Field(description="answers with status >= 400 from a deployment (refusals for limits among them)")
    prompt_tokens: int = Field(description="as the engines counted them (`usage`)")
    completion_tokens: int
    queue_seconds: float = Field(description="the requests' waits for a ready replica, summed")


class PointOut(CountsOut):
    at: int = Field(description="the step's start, unix seconds")


class GroupOut(Schema):
    key: str = Field(description="the team's or deployment's name, or the token's prefix")
    label: str
    totals: CountsOut
    series: list[PointOut] = Field(description="one point per step from `since`, empty steps included")


class UsageOut(Schema):
    group: str
    since: int
    until: int
    step: int
    totals: CountsOut
    groups: list[GroupOut] = Field(description="most requests first")


def read(request, query: UsageQuery) -> Report:
    """The report a query asks for, as the caller may see it (Invalid naming a bad parameter)."""
    now = time.time()
    until = _until(query.until, now)
    _check_time("until", query.until, until)
    if query.since and query.since.strip():
        since = parse_since(query.since, until)
        _check_time("since", query.since, since)
        if not (query.until and query.until.strip()) and since >= until:
            raise refused("since", f"since {query.since.strip()[:40]!r} is in the future: it must be before until, "
                          "which is now when not given")
    elif int(until) <= EARLIEST:
        raise refused("until", f"until {query.until.strip()[:40]!r} must be after 1970-01-01T00:00:00Z")
    else:
        since = max(EARLIEST, until - DAY)
    since, until = int(since), int(until)
    step = query.step or next((s for s in AUTO_STEPS if (until - since) / s <= AUTO_POINTS), AUTO_STEPS[-1])
    return report(TeamScope.of(request.user), query.group, since, until, step, query.team, query.deployment)


def _check_time(name: str, text: str | None, value: float) -> None:
    """Refuse a time a datetime cannot hold (before 1970 or after 9999), naming the parameter."""
    if not EARLIEST <= value <= LATEST:
        raise refused(name, f"{name} {(text or '').strip()[:40]!r} is outside 1970-01-01T00:00:00Z to "
                      f"9999-12-31T23:59:59Z ({EARLIEST} to {LATEST} unix seconds)")


def _until(text: str | None, now: float) -> float:
    if text is None or not text.strip():
        return now
    try:
        return parse_since(text, now)
    except Invalid:
        raise refused("until", f"until {text[:40]!r} is neither unix seconds nor an ISO 8601 time") from None


@router.get("", response={200: UsageOut, 422: ErrorOut},
            summary="Usage per team, token or deployment: requests, errors, tokens, queue time (your teams')")
def usage(request, query: Query[UsageQuery]):
    got = read(request, query)
    times = got.times
    return {"group": got.group, "since": got.since, "until": got.until, "step": got.step,
            "totals": got.totals.as_dict(),
            "groups": [{"key": g.key, "label": g.label, "totals": g.totals.as_dict(),
                        "series": [{"at": t, **p.as_dict()} for t, p in zip(times, g.series, strict=True)]}
                       for g in got.groups]}


@csv_router.get("", response={200: None, 422: ErrorOut}, summary="Usage as CSV: one row per step and group "
                "(steps without requests left out)")
def usage_csv(request, query: Query[UsageQuery]):
    got = read(request, query)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["period_start", "period_seconds", got.group, "label", *COUNTS])
    for g in got.groups:
        for t, p in zip(got.times, g.series, strict=True):
            if p.requests:
                writer.writerow([datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z"), got.step,
                                 g.key, g.label, *p.as_dict().values()])
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    stamp = datetime.fromtimestamp(got.since, UTC).strftime("%Y%m%dT%H%M")
    response["Content-Disposition"] = f'attachment; filename="usage-by-{got.group}-{stamp}.csv"'
    return response
