"""The series through the API: `GET /deployments/{name}/series` and `GET /hosts/{name}/series`, attached under
the deployments' and hosts' prefixes in console/api.py."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Annotated, Literal

from annotated_types import Len
from ninja import Field, Query, Router, Schema

from console.accounts.teams import teams_of
from console.catalog.schemas import ErrorOut
from console.deployments.services import get_deployment
from console.errors import Invalid
from console.series.metrics import DEPLOYMENT, DEPLOYMENT_METRICS, HOST, HOST_METRICS, METRICS
from console.series.store import read_points, resolve

DEFAULT_RANGE_S = 3600
SINCE_HELP = "unix seconds or ISO 8601 (`2026-11-22T10:00:00Z`; no offset: UTC); default an hour ago"

deployment_router = Router()
host_router = Router()


class SeriesOut(Schema):
    metric: str
    unit: str = Field(description="req/s, ms, errors/s, replicas, bytes or %")
    resolution_s: int = Field(description="10: points of the 10-second series (a range up to a day); 300: "
                              "5-minute means")
    # Pairs as two-item lists: OpenAPI 3.0 has no tuple (prefixItems), and clients read them as lists anyway.
    points: list[Annotated[list[int | float | None], Len(2, 2)]] = Field(
        description="[unix seconds, value], oldest first; each value holds until the next point (a step "
        "function, stored only when it changed); null: no reading then (no traffic, host offline, sampler "
        "down). The first point is the value in force at `since`, the last the latest sample")


class DeploymentSeriesQuery(Schema):
    metric: Literal[tuple(DEPLOYMENT_METRICS)] = Field(  # type: ignore[valid-type]
        description="request_rate (req/s), p50_ms, p95_ms, queue_ms (p95 wait for a ready replica), errors "
        "(errors/s), replicas (ready or standby), replicas_loading, replicas_sleeping, replicas_failed")
    since: str | None = Field(None, description=SINCE_HELP, max_length=40)


class HostSeriesQuery(Schema):
    metric: Literal[tuple(HOST_METRICS)] = Field(  # type: ignore[valid-type]
        description="reserved_bytes, measured_bytes, foreign_bytes (used by processes ModelGrid does not own), "
        "total_bytes, utilization (% mean over its GPUs)")
    since: str | None = Field(None, description=SINCE_HELP, max_length=40)


def parse_since(text: str | None, now: float) -> float:
    """`since` as unix seconds: a number, or an ISO 8601 time (UTC without an offset); default an hour ago."""
    if text is None or not text.strip():
        return now - DEFAULT_RANGE_S
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            value = math.nan
        else:
            value = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(value):
        raise Invalid("", errors=[{"loc": ["query", "since"], "type": "invalid",
                                   "msg": f"since {text[:40]!r} is neither unix seconds nor an ISO 8601 time"}])
    return value


def series_answer(kind: str, name: str, metric: str, since: str | None) -> dict:
    """The API's answer for one series of one object (NotFound, Invalid as the API maps them)."""
    kind, object_id = resolve(f"{kind}/{name}")
    now = time.time()
    read = read_points(kind, object_id, metric, parse_since(since, now), now)
    whole = METRICS[kind][metric].whole
    return {"metric": metric, "unit": METRICS[kind][metric].unit, "resolution_s": read.resolution_s,
            "points": [[t, int(v) if whole and v is not None and v.is_integer() else v] for t, v in read.points]}


@deployment_router.get("/{name}/series", response={200: SeriesOut, 404: ErrorOut, 422: ErrorOut},
                       summary="A deployment's figures over time: request rate, latency, queue wait, errors, "
                       "replicas by state")
def deployment_series(request, name: str, query: Query[DeploymentSeriesQuery]):
    get_deployment(name, teams=teams_of(request.user))  # another team's is as missing as none (404)
    return series_answer(DEPLOYMENT, name, query.metric, query.since)


@host_router.get("/{name}/series", response={200: SeriesOut, 404: ErrorOut, 422: ErrorOut},
                 summary="A host's GPU memory (reserved, measured, used by others, total) and utilisation over time")
def host_series(request, name: str, query: Query[HostSeriesQuery]):
    return series_answer(HOST, name, query.metric, query.since)
