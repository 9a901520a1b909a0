"""Charts over time, stored in the database at two resolutions, written change-only.

Design. A series (one metric of one deployment, host or the fleet) is a step function: a point (t, v) holds
until the series' next point, and readers fill forward. The sampler runs every chore tick (about 10 s) and
writes a 10-second ("fine") point only when a value differs from the one in force, after rounding to what a
chart can show (three significant digits; bytes whole). At each 5-minute boundary it writes a coarse point
only when the window's time-weighted mean differs from the last coarse point. Why this and not chunks:

* cost follows change, not fleet size: a deployment without traffic, an idle host, a steady replica count
  write nothing after their first point, so 10,000 mostly quiet deployments cost a few hundred rows a tick,
  not 90,000; the worst case (every value moving every tick) is one narrow row per changed series;
* points are appended in one batch per tick and never rewritten (chunks would be read, grown and rewritten
  each tick, or lose their unflushed points when the scheduler leader changes);
* the 5-minute mean needs no write per tick either: each series row keeps the time-weighted sum of the
  current window up to its last change, so a window's mean is known at its end from that row alone.

The per-series state (value in force, window sum, last coarse value) is one row per series in `Series`:
each tick compares with the values in force (those the last tick left in this process, else every series'
value read in one query; all of its state when a window closes) and writes back only the series that
changed, in one batch. Pruning by age runs in the same chore; a series keeps its value
past pruning through that row (`since`), so a value unchanged for longer than the fine retention still reads
back. Ticks missing for a while (no leader) are recorded as an `Outage`, where readers break lines instead of
carrying the last value across. docs/benchmarks.md ("Observability") has what it costs at fleet size.

`read()` is what the rest of the console uses (the API, the charts, alert rules)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import OuterRef, Q, Subquery

from console.accounts.models import Team
from console.bulk import insert_values, update_values
from console.deployments.models import Deployment
from console.errors import Invalid, NotFound
from console.fleet.models import Host
from console.series.metrics import DEPLOYMENT, FLEET, HOST, METRICS, TEAM, quantize
from console.series.models import Clock, Outage, Point, Series

FINE_STEP_S = 10  # the chores' period (console/control/chores.py CHORE_SECONDS): the sampler is one of them
COARSE_STEP_S = 300
FINE_SPAN_MAX_S = 86400  # a range up to a day reads 10-second points, a longer one 5-minute points
MAX_POINTS = 10_000  # a read never answers more (a longer coarse retention is thinned)
OUTAGE_AFTER_S = 3 * FINE_STEP_S  # a tick this long after the last one: the sampler was not running

Key = tuple[str, int, str]  # (kind, object id, metric)
_STATE = ("id", "value", "since", "acc_window", "acc_sum", "acc_seconds", "coarse_value", "coarse_since")
_UPDATED = _STATE[1:]


@dataclass(slots=True)
class _State:
    id: int
    value: float | None
    since: int
    acc_window: int
    acc_sum: float
    acc_seconds: float
    coarse_value: float | None
    coarse_since: int | None

    def window_mean(self, window: int) -> float | None:
        """The time-weighted mean of `window` (closed: no change came after its end), None with no value."""
        start, end = window * COARSE_STEP_S, (window + 1) * COARSE_STEP_S
        total, seconds = (self.acc_sum, self.acc_seconds) if self.acc_window == window else (0.0, 0.0)
        held = end - max(self.since, start)
        if self.value is not None and held > 0:
            total, seconds = total + self.value * held, seconds + held
        return total / seconds if seconds else None

    def change(self, value: float | None, now: int) -> None:
        """`value` holds from `now`: the one it replaces goes into the current window's sum first."""
        window = now // COARSE_STEP_S
        if self.acc_window != window:
            self.acc_window, self.acc_sum, self.acc_seconds = window, 0.0, 0.0
        held = now - max(self.since, window * COARSE_STEP_S)
        if self.value is not None and held > 0:
            self.acc_sum += self.value * held
            self.acc_seconds += held
        self.value, self.since = value, now


_UNITS = {(kind, name): metric.unit for kind, metrics in METRICS.items() for name, metric in metrics.items()}


@dataclass(frozen=True)
class Recorded:
    points: int  # rows written
    window_closed: bool  # a 5-minute window ended with this tick


@dataclass
class _Known:
    """Every series' id and value in force as this process recorded them at `tick`, in database `database`."""

    database: str
    tick: int
    series: dict[Key, tuple[int, float | None]]


# What the last tick here left, so that the next one (the clock at that tick: nobody recorded since) compares
# against it instead of reading every series again: at 10,000 deployments that read built 95,006 rows into Python
# tuples every 10 s, 0.13 s of a 0.33 s steady tick holding the interpreter lock that the agent links' event loop
# needs in a rollout's waves (bench/series_cost.py, and a sampling profile of a 1,000-host wave; docs/benchmarks.md).
_known: _Known | None = None


@transaction.atomic
def record(values: dict[Key, float | None], now: int) -> Recorded:
    """Store what changed in `values`, every series the sampler read at `now` (unix seconds); a stored series
    missing from it (its object is gone) gets a gap."""
    global _known
    clock, _ = Clock.objects.select_for_update().get_or_create(pk=1)
    last = clock.last_tick
    if last is not None and now <= last:
        return Recorded(0, False)  # this second is recorded already (or the clock stepped back)
    known, _known = _known, None  # until this tick is written whole: a failure below leaves nothing to trust
    window = now // COARSE_STEP_S
    window_closed = last is not None and last // COARSE_STEP_S < window
    database = connection.settings_dict["NAME"]
    full: dict[int, tuple] = {}
    if not window_closed and known is not None and (known.database, known.tick) == (database, last):
        current = known.series
    else:
        # Each row: its key, then its state as _State takes it (all of it when every mean is due, else the
        # value alone, enough to see what changed).
        columns = _STATE if window_closed else ("id", "value")
        rows = list(Series.objects.values_list("kind", "object_id", "metric", *columns))
        current = {row[:3]: (row[3], row[4]) for row in rows}
        if window_closed:
            full = {row[3]: row[3:] for row in rows}
    dirty: dict[int, _State] = {}
    points: list[tuple[int, bool, int, float | None]] = []
    if window_closed:
        closing = last // COARSE_STEP_S
        for key, (sid, _) in current.items():
            s = _State(*full[sid])
            mean = quantize(s.window_mean(closing), _UNITS.get((key[0], key[2]), ""))
            if s.coarse_since is None or mean != s.coarse_value:
                s.coarse_value, s.coarse_since = mean, closing * COARSE_STEP_S
                points.append((s.id, True, s.coarse_since, mean))
                dirty[s.id] = s
    new, changes = [], []
    for key, raw in values.items():
        held = current.get(key)
        if held is None:
            new.append((*key, quantize(raw, _UNITS.get((key[0], key[2]), "")), now, now, window, 0.0, 0.0))
        elif raw != held[1]:  # a stored value is already rounded: equal means unchanged
            value = quantize(raw, _UNITS.get((key[0], key[2]), ""))
            if value != held[1]:
                changes.append((key, held[0], value))
    # A series no longer read (its object is gone): a gap from now on.
    changes += [(key, sid, None) for key, (sid, value) in current.items() if value is not None and key not in values]
    full |= _states([sid for _, sid, _ in changes if sid not in full], len(current))
    for _, sid, value in changes:
        s = dirty.get(sid) or _State(*full[sid])
        s.change(value, now)
        points.append((sid, False, now, value))
        dirty[sid] = s
    created = _create(new, now)
    points += [(sid, False, now, value) for _, (sid, value) in created]
    _write(points, dirty.values())
    if last is not None and now - last > OUTAGE_AFTER_S:
        Outage.objects.create(start=last, end=now)
    clock.last_tick = now
    clock.save(update_fields=["last_tick"])
    current.update({key: (sid, value) for key, sid, value in changes})
    current.update(created)
    _known = _Known(database, now, current)
    return Recorded(len(points), window_closed)


def forget() -> None:
    """Read every series again at the next tick (their rows were deleted or written by another hand)."""
    global _known
    _known = None


def _states(ids: list[int], stored: int) -> dict[int, tuple]:
    """The whole state of the series `ids` (of `stored` in all): by id, a few hundred at a time, or all of them
    in one read when many changed."""
    if not ids:
        return {}
    if len(ids) * 4 > stored:
        return {row[0]: row for row in Series.objects.values_list(*_STATE)}
    found = {}
    for i in range(0, len(ids), 900):
        found |= {row[0]: row for row in Series.objects.filter(pk__in=ids[i:i + 900]).values_list(*_STATE)}
    return found


_NEW = ("kind", "object_id", "metric", "value", "since", "first", "acc_window", "acc_sum", "acc_seconds")


def _create(rows: list[tuple], now: int) -> list[tuple[Key, tuple[int, float | None]]]:
    """Create the series of `rows` (their _NEW fields), first recorded at `now`; returns each one's key, id and
    value. Not bulk_create: building and compiling a model instance per row made a first tick at 10,000 deployments
    (95,006 series) take 5.9 s on PostgreSQL. Their ids are read back by their first tick (only this one, holding
    the clock's row, creates series first recorded at `now`), of these keys alone."""
    if not rows:
        return []
    insert_values(Series, _NEW, rows)
    wanted = {row[:3] for row in rows}
    return [(row[:3], (row[3], row[4])) for row in
            Series.objects.filter(first=now).values_list("kind", "object_id", "metric", "id", "value")
            if row[:3] in wanted]


def _write(points: list[tuple], changed: Iterable[_State]) -> None:
    """Append the points and write back the changed series' state, by COPY on PostgreSQL (console/bulk.py). Not
    bulk_create and bulk_update: at 10,000 deployments, building a model instance and compiling it per row cost 7
    to 20 times as much as the database's own work (127 ms against 19 ms for 7,000 points, 174 ms against 8 ms for
    their series, SQLite; docs/benchmarks.md)."""
    insert_values(Point, ("series", "coarse", "t", "value"), points)
    update_values(Series, _UPDATED, [(s.id, *(getattr(s, f) for f in _UPDATED)) for s in changed])


def fine_retention_s() -> float:
    return settings.MODELGRID_SERIES_FINE_RETENTION_SECONDS


def coarse_retention_s() -> float:
    return settings.MODELGRID_SERIES_COARSE_RETENTION_SECONDS


def prune(now: int, thorough: bool = False) -> int:
    """Delete points older than their resolution's retention; `thorough` (once a window) also the series of
    objects gone longer than that, and old outages. Returns the points deleted."""
    fine_cut, coarse_cut = now - fine_retention_s(), now - coarse_retention_s()
    deleted = Point.objects.filter(coarse=False, t__lt=fine_cut).delete()[0]
    deleted += Point.objects.filter(coarse=True, t__lt=coarse_cut).delete()[0]
    if thorough:
        stale = Series.objects.filter(Q(value__isnull=True, since__lt=coarse_cut),
                                      Q(coarse_since__isnull=True) | Q(coarse_since__lt=coarse_cut))
        gone = (stale.filter(kind=DEPLOYMENT).exclude(object_id__in=Deployment.objects.values("pk"))
                | stale.filter(kind=HOST).exclude(object_id__in=Host.objects.values("pk"))
                | stale.filter(kind=TEAM).exclude(object_id__in=Team.objects.values("pk")))
        Series.objects.filter(pk__in=list(gone.values_list("pk", flat=True))).delete()
        forget()
        Outage.objects.filter(end__lt=coarse_cut).delete()
    return deleted


# -- reading -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Points:
    """What a read answers: the resolution it chose and the points, each holding until the next."""

    resolution_s: int
    points: list[tuple[int, float | None]]


def resolve(object_key: str) -> tuple[str, int]:
    """("deployment", pk) for "deployment/NAME", ("host", pk) for "host/NAME", ("fleet", 0) for "fleet";
    NotFound for an object that does not exist."""
    if object_key == FLEET:
        return FLEET, 0
    kind, _, name = object_key.partition("/")
    model = {DEPLOYMENT: Deployment, HOST: Host}.get(kind)
    if model is None or not name:
        raise NotFound(f"{object_key!r} names no series: use deployment/NAME, host/NAME or fleet")
    pk = model.objects.filter(name=name).values_list("pk", flat=True).first()
    if pk is None:
        raise NotFound(f"no {kind} named {name!r}")
    return kind, pk


def read(object_key: str, metric: str, since: float, now: float | None = None) -> list[tuple[int, float | None]]:
    """The points of `metric` for `object_key` (deployment/NAME, host/NAME or fleet) from `since` (unix
    seconds) to the last sample: a step function, value None where there was no reading."""
    kind, object_id = resolve(object_key)
    return read_points(kind, object_id, metric, since, now).points


def check_metric(kind: str, metric: str) -> None:
    """Invalid (naming the allowed ones) for a metric `kind` does not record."""
    if metric not in METRICS[kind]:
        raise Invalid("", errors=[{"loc": ["query", "metric"], "type": "invalid",
                                   "msg": f"unknown metric {metric!r}; one of {', '.join(METRICS[kind])}"}])


def read_points(kind: str, object_id: int, metric: str, since: float, now: float | None = None) -> Points:
    """As read(), for an object already resolved, with the resolution: 10 s up to a day back, else 5 min."""
    return read_many(kind, object_id, [metric], since, now)[metric]


def resolution(since: float, now: float) -> int:
    """The step a read from `since` to `now` answers in: 10 s up to a day back (and the fine retention), else 5 min."""
    return COARSE_STEP_S if now - since > min(FINE_SPAN_MAX_S, fine_retention_s()) else FINE_STEP_S


def read_sum(objects: list[tuple[str, int]], metric: str, since: float, now: float | None = None) -> Points:
    """read_points() of `metric` summed over `objects` ((kind, object id) each): at each time the sum of the values
    in force then, None where none of them has one. What a team's member sees of a fleet-wide figure is the sum of
    their teams' (console/accounts/scope.py)."""
    now = time.time() if now is None else now
    reads = [read_points(kind, object_id, metric, since, now) for kind, object_id in objects]
    if len(reads) == 1:
        return reads[0]
    times = sorted({t for read in reads for t, _ in read.points})
    summed, at = [], [0] * len(reads)
    for t in times:
        values = []
        for i, read in enumerate(reads):
            while at[i] < len(read.points) and read.points[at[i]][0] <= t:
                at[i] += 1
            values.append(read.points[at[i] - 1][1] if at[i] else None)
        known = [v for v in values if v is not None]
        summed.append((t, sum(known) if known else None))
    return Points(reads[0].resolution_s if reads else resolution(since, now), summed)


def read_many(kind: str, object_id: int, metrics: list[str], since: float, now: float | None = None
              ) -> dict[str, Points]:
    """read_points() for several metrics of one object in the same few queries, whatever their number."""
    for metric in metrics:
        check_metric(kind, metric)
    now = time.time() if now is None else now
    step = resolution(since, now)
    coarse = step == COARSE_STEP_S
    since = int(max(since, now - (coarse_retention_s() if coarse else fine_retention_s())))
    answer = {metric: Points(step, []) for metric in metrics}
    last_tick = Clock.objects.filter(pk=1).values_list("last_tick", flat=True).first()
    # A 5-minute point covers its window: the last one readable is the window before the open one.
    end = None if last_tick is None else (last_tick // COARSE_STEP_S - 1) * COARSE_STEP_S if coarse else last_tick
    if end is None or since > end:
        return answer
    series = {row["id"]: row for row in Series.objects.filter(kind=kind, object_id=object_id, metric__in=metrics)
              .values("metric", "first", *_STATE)}
    if not series:
        return answer
    stored: dict[int, list[tuple[int, float | None]]] = {sid: [] for sid in series}
    for sid, t, value in (Point.objects.filter(series_id__in=list(series), coarse=coarse, t__gt=since, t__lte=end)
                          .order_by("series_id", "t", "pk").values_list("series_id", "t", "value")):
        stored[sid].append((t, value))
    at_since = _values_at(list(series.values()), coarse, since)
    outages = list(Outage.objects.filter(end__gt=since, start__lt=end).order_by("start").values_list("start", "end"))
    for sid, row in series.items():
        points = stored[sid]
        if sid in at_since:
            points.insert(0, (since, at_since[sid]))
        if points and points[-1][0] < end and points[-1][1] is not None:
            points.append((end, points[-1][1]))
        answer[row["metric"]] = Points(step, _thin(_break_at(points, outages, step), MAX_POINTS))
    return answer


def _values_at(series: list[dict], coarse: bool, at: int) -> dict[int, float | None]:
    """The value in force at `at` of each series known then: its last point up to then; once pruned, the series
    row's value when it has not changed since; failing that (fine), the 5-minute mean of the time. None of a
    series before its first point. One query (two when 10-second points were pruned)."""
    existing = [row for row in series if row["first"] <= at]
    found = _last_points([row["id"] for row in existing], coarse, at)
    missing = []
    for row in existing:
        if row["id"] in found:
            continue
        value, since = (row["coarse_value"], row["coarse_since"]) if coarse else (row["value"], row["since"])
        if since is not None and since <= at:
            found[row["id"]] = value
        elif not coarse:
            missing.append(row["id"])
    return found | _last_points(missing, True, at)


def _last_points(ids: list[int], coarse: bool, at: int) -> dict[int, float | None]:
    """Each series' last point up to `at` (those that have one), in one query: a subquery per series row, each
    an index lookup."""
    if not ids:
        return {}
    last = Point.objects.filter(series_id=OuterRef("pk"), coarse=coarse, t__lte=at).order_by("-t", "-pk")
    rows = (Series.objects.filter(pk__in=ids).annotate(t=Subquery(last.values("t")[:1]),
                                                       v=Subquery(last.values("value")[:1]))
            .values_list("pk", "t", "v"))
    return {sid: value for sid, t, value in rows if t is not None}


def _break_at(points: list[tuple[int, float | None]], outages: Iterable[tuple[int, int]], step: int
              ) -> list[tuple[int, float | None]]:
    """A gap (None) from a step after the last tick before each outage, and the value in force again from the
    first tick after it (a 5-minute read: from the windows around it)."""
    extra = []
    for start, end in outages:
        if step == COARSE_STEP_S:
            start, end = (start // step) * step, (end // step) * step
        if start + step >= end:
            continue
        held = [v for t, v in points if t <= end]
        extra += [(start + step, None), *([(end, held[-1])] if held and held[-1] is not None else [])]
    if not extra or not points:
        return points
    merged: dict[int, float | None] = {}
    for t, v in sorted(extra + points, key=lambda p: p[0]):  # stable: at equal times, stored points win
        merged[t] = v
    first, last = points[0][0], points[-1][0]
    at_first = [v for t, v in merged.items() if t <= first][-1]  # None when the read starts inside an outage
    return [(first, at_first), *((t, v) for t, v in merged.items() if first < t <= last)]


def _thin(points: list[tuple[int, float | None]], limit: int) -> list[tuple[int, float | None]]:
    """At most about `limit` points: the last of each of `limit` equal stretches of time."""
    if len(points) <= limit:
        return points
    t0, width = points[0][0], (points[-1][0] - points[0][0]) / limit or 1
    kept: dict[int, tuple[int, float | None]] = {}
    for p in points:
        kept[int((p[0] - t0) / width)] = p
    return list(kept.values())
