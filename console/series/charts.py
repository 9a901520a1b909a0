"""Charts drawn on the server as inline SVG: step series resampled onto a fixed grid of columns, nice axis
ticks with units, an optional target line, hover bands with the values at each time. Pure: points in, the
geometry a template draws out (templates/series/_chart.html). No database, no JavaScript."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from console.fleet.templatetags.units import ms, rate

# The default drawing size: a chart is drawn about as large as it is shown, so its 10-pixel text reads as such.
WIDTH, HEIGHT = 560, 180
LEFT, RIGHT, TOP, BOTTOM = 62, 10, 10, 22  # the plot's margins: y tick labels left, time ticks below
COLUMNS = 120  # drawing resolution: a line never has more vertices than this, however many points
BANDS = 40  # hover bands, each titled with the values in it
TIME_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 432000, 604800)

Points = list[tuple[int, float | None]]
NOT_YET = "the console records a point every 10 s while its scheduler runs, and has none here yet."


@dataclass(frozen=True)
class Line:
    key: str  # a CSS modifier: the line's colour
    label: str
    points: Points
    dashed: bool = False
    fill: bool = False  # shade the area under it


def fmt(value: float | None, unit: str) -> str:
    """A value with its unit, for people: the console's unit filters where they fit."""
    if value is None:
        return "–"
    if unit == "ms":
        return ms(value)
    if unit == "req/s":
        return rate(value)
    if unit == "bytes":
        return _bytes(value)
    if unit == "%":
        return f"{value:.0f}%"
    if unit == "replicas":
        return f"{value:g}" if value == int(value) else f"{value:.1f}"
    return f"{_number(value)} {unit}"


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def _bytes(value: float) -> str:
    for size, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB")):
        if abs(value) >= size:  # three figures, never an exponent (1000 MiB, not 1e+03 MiB)
            return f"{value / size:.0f} {unit}" if abs(value) >= 100 * size else f"{value / size:.3g} {unit}"
    return "0" if value == 0 else f"{value / (1 << 20):.2g} MiB"


def nice_step(span: float, ticks: int = 5) -> float:
    """A step of 1, 2, 2.5 or 5 times a power of ten that splits `span` into about `ticks` parts."""
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def _byte_step(span: float, ticks: int = 5) -> float:
    """Bytes split at whole GiB (TiB) multiples where they are that large, so the ticks read as round figures."""
    for size in (1 << 40, 1 << 30, 1 << 20):
        if span >= 2 * size:
            return nice_step(span / size, ticks) * size
    return nice_step(span, ticks)


def resample(points: Points, start: float, end: float, hold: float, columns: int = COLUMNS) -> list[float | None]:
    """The step function `points` (each value holding until the next point; the last for `hold` seconds) as
    the time-weighted mean of each of `columns` equal stretches of [start, end); None where it had no value."""
    width = (end - start) / columns
    sums, covered = [0.0] * columns, [0.0] * columns
    for i, (t, v) in enumerate(points):
        until = points[i + 1][0] if i + 1 < len(points) else t + hold
        a, b = max(t, start), min(until, end)
        if v is None or b <= a:
            continue
        first, last = int((a - start) / width), min(int((b - start) / width), columns - 1)
        for c in range(first, last + 1):
            c0 = start + c * width
            overlap = min(b, c0 + width) - max(a, c0)
            if overlap > 0:
                sums[c] += v * overlap
                covered[c] += overlap
    return [s / w if w > 0 else None for s, w in zip(sums, covered, strict=True)]


def _time_label(t: float, step: int, long: bool = False) -> str:
    """A tick's time: HH:MM, or the day for ticks a day apart; `long` (a hover over days): both."""
    when = datetime.fromtimestamp(t, tz=UTC)
    if long:
        return when.strftime("%b %d %H:%M")
    return when.strftime("%b %d") if step >= 86400 else when.strftime("%H:%M")


def chart(name: str, title: str, unit: str, lines: list[Line], start: float, end: float, resolution: int,
          target: float | None = None, target_label: str = "", stacked: bool = False, note: str = "",
          size: tuple[int, int] = (WIDTH, HEIGHT), empty_reason: str = NOT_YET) -> dict:
    """Everything templates/series/_chart.html draws for one chart over [start, end]."""
    columns = [resample(line.points, start, end, resolution) for line in lines]
    if stacked:  # each line drawn on top of the ones before it
        tops, running = [], [None] * COLUMNS
        for col in columns:
            running = [None if a is None and b is None else (a or 0.0) + (b or 0.0) for a, b in zip(running, col,
                                                                                                     strict=True)]
            tops.append(running)
        drawn = tops
    else:
        drawn = columns
    readings = sum(1 for line in lines for _, v in line.points if v is not None)
    peak = max([v for col in drawn for v in col if v is not None] + ([target] if target else []), default=0.0)
    # A share is drawn against the whole; nothing at all, against one whole unit (a GiB for bytes, not a byte).
    ceiling = 100.0 if unit == "%" else peak * 1.08 or (float(2 << 30) if unit == "bytes" else 1.0)
    step = _byte_step(ceiling) if unit == "bytes" else max(nice_step(ceiling), 1.0 if unit == "replicas" else 0.0)
    top_value = step * math.ceil(ceiling / step)
    width, height = size
    x0, x1, y0, y1 = LEFT, width - RIGHT, height - BOTTOM, TOP
    col_w = (x1 - x0) / COLUMNS

    def y(v: float) -> float:
        return round(y0 - (y0 - y1) * v / top_value, 1)

    paths = []
    for i, (line, col) in enumerate(zip(lines, drawn, strict=True)):
        below = drawn[i - 1] if stacked and i else None
        paths.append({"key": line.key, "label": line.label, "dashed": line.dashed,
                      # Stacked: a band's top edge only where it has a thickness (an empty band's edge
                      # would lie on the one below it, in the wrong colour).
                      "d": _path([v if not stacked or (own or 0) > 0 else None
                                  for v, own in zip(col, columns[i], strict=True)], x0, col_w, y),
                      "area": _area(col, below, x0, col_w, y) if stacked or line.fill else "",
                      "title": f"{line.label}: latest {fmt(_last(line.points), unit)}"})
    time_step = next((s for s in TIME_STEPS if (end - start) / s <= 6), TIME_STEPS[-1])
    first_tick = math.ceil(start / time_step) * time_step
    x_ticks = [{"x": round(x0 + (x1 - x0) * (t - start) / (end - start), 1), "label": _time_label(t, time_step)}
               for t in range(int(first_tick), int(end) + 1, time_step)]
    y_ticks = [{"y": y(v), "label": fmt(v, unit) if v else "0"} for v in _frange(top_value, step)]
    band_w, long = (x1 - x0) / BANDS, end - start > 86400
    bands = []
    for b in range(BANDS):
        cols = range(b * COLUMNS // BANDS, (b + 1) * COLUMNS // BANDS)
        t0, t1 = start + (end - start) * b / BANDS, start + (end - start) * (b + 1) / BANDS
        values = [f"{line.label} {fmt(_mean([columns[i][c] for c in cols]), unit)}" for i, line in enumerate(lines)]
        bands.append({"x": round(x0 + b * band_w, 1), "w": round(band_w, 1),
                      "title": f"{_time_label(t0, 60, long)}–{_time_label(t1, 60, long)} UTC · " + " · ".join(values)})
    primary = lines[0].points if lines else []
    return {
        "name": name, "title": title, "unit": unit, "note": note, "empty": readings == 0, "points": readings,
        "empty_reason": empty_reason,
        "last": _last(primary), "max": max((v for _, v in primary if v is not None), default=None),
        "width": width, "height": height, "x0": x0, "x1": x1, "y0": y0, "y1": y1, "plot_height": y0 - y1,
        "label_x": x0 - 6, "tick_y": y0 + 4, "time_y": height - 5,
        "x_ticks": x_ticks, "y_ticks": y_ticks, "paths": paths, "bands": bands,
        "target": {"y": y(target), "label_y": y(target) - 4, "label": target_label or fmt(target, unit),
                   "value": target} if target else None,
        "legend": [{"key": line.key, "label": line.label, "value": fmt(_last(line.points), unit),
                    "dashed": line.dashed} for line in lines],
    }


def _frange(top: float, step: float) -> list[float]:
    count = round(top / step)
    return [step * i for i in range(count + 1)]


def _mean(values: list[float | None]) -> float | None:
    seen = [v for v in values if v is not None]
    return sum(seen) / len(seen) if seen else None


def _last(points: Points) -> float | None:
    return points[-1][1] if points else None


def _path(col: list[float | None], x0: float, w: float, y) -> str:
    """An SVG path through the columns' centres, broken where a column has no value."""
    parts, pen = [], False
    for c, v in enumerate(col):
        if v is None:
            pen = False
            continue
        x = round(x0 + (c + 0.5) * w, 1)
        parts.append(f"{'L' if pen else 'M'}{x} {y(v)}")
        pen = True
    return " ".join(parts)


def _area(col: list[float | None], below: list[float | None] | None, x0: float, w: float, y) -> str:
    """The band between this stacked line and the one below it (the axis for the first), per unbroken run."""
    runs, run = [], []
    for c, v in enumerate(col):
        if v is None:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(c)
    if run:
        runs.append(run)
    shapes = []
    for cs in runs:
        upper = [f"{round(x0 + c * w, 1)} {y(col[c])} {round(x0 + (c + 1) * w, 1)} {y(col[c])}" for c in cs]
        lower = [f"{round(x0 + (c + 1) * w, 1)} {y((below[c] or 0.0) if below else 0.0)} "
                 f"{round(x0 + c * w, 1)} {y((below[c] or 0.0) if below else 0.0)}" for c in reversed(cs)]
        shapes.append("M" + " L".join(upper + lower) + " Z")
    return " ".join(shapes)
