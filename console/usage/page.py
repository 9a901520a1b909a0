"""What the usage page shows over a range: the totals, a chart of tokens per team, per key and per model (the
busiest few each, the rest as one line), and a table by team, key or model, as the reader's teams may see."""

from __future__ import annotations

import time
from urllib.parse import urlencode

from console.accounts.scope import TeamScope
from console.catalog.names import is_name
from console.series.charts import Line, chart
from console.usage.report import Counts, Report, report

# The range selector: key (the `range` parameter), seconds, label, step.
RANGES = (("1h", 3600, "1 h", 60), ("6h", 6 * 3600, "6 h", 300), ("24h", 86400, "24 h", 900),
          ("7d", 7 * 86400, "7 d", 3600), ("30d", 30 * 86400, "30 d", 21600))
DEFAULT_RANGE = "24h"
TABLES = (("team", "Team"), ("token", "API key"), ("deployment", "Model"))
CHARTS = (("team", "Tokens per team"), ("token", "Tokens per key"), ("deployment", "Tokens per model"))
SHOWN = 5  # lines per chart; the rest are summed into one
SIZE = (380, 170)
NO_USAGE = "no requests reached a deployment in this range."


def range_key(value: str | None) -> str:
    return value if any(value == key for key, *_ in RANGES) else DEFAULT_RANGE


def table_key(value: str | None) -> str:
    return value if any(value == key for key, _ in TABLES) else "team"


def model_key(value: str | None) -> str:
    """The one model the page is narrowed to ("": all of them): a deployment's name, else nothing."""
    return value if value and is_name(value) else ""


def usage_page(scope: TeamScope, key: str, by: str, now: float | None = None, model: str = "") -> dict:
    """Everything templates/usage/page.html draws for range `key` with the table by `by`, of one `model` if named, as
    `scope` may see it."""
    now = time.time() if now is None else now
    seconds, step = next((s, st) for k, s, _, st in RANGES if k == key)
    until = int(now) - int(now) % 60 + 60  # through the current minute
    since = until - seconds
    reports = {group: report(scope, group, since, until, step, deployment=model or None) for group, _ in CHARTS}
    charts = [_chart(group, title, reports[group]) for group, title in CHARTS]
    shown = reports[by]
    total = shown.totals
    query = urlencode({"group": by, "since": since, "until": until, "step": step} | ({"deployment": model} if model
                                                                                      else {}))
    return {
        "range": key, "by": by, "step": step, "step_text": _duration(step), "model": model,
        "narrow": f"&model={model}" if model else "",
        "ranges": [{"key": k, "label": label, "current": k == key} for k, _, label, _ in RANGES],
        "tables": [{"key": k, "label": label, "current": k == by} for k, label in TABLES],
        "by_label": dict(TABLES)[by],
        "totals": _figures(total),
        "charts": charts,
        "rows": [{"key": g.key, "label": g.label, **_figures(g.totals),
                  "share": round(100 * _tokens(g.totals) / (_tokens(total) or 1), 1)} for g in shown.groups],
        "csv": f"/api/v1/usage.csv?{query}",
        "json": f"/api/v1/usage?{query}",
    }


def _tokens(c: Counts) -> int:
    return c.prompt_tokens + c.completion_tokens


def _figures(c: Counts) -> dict:
    return {"requests": c.requests, "errors": c.errors, "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens, "tokens": _tokens(c),
            "error_pct": round(100 * c.errors / c.requests, 1) if c.requests else 0.0,
            "queue_ms": round(1000 * c.queue_seconds / c.requests, 1) if c.requests else None}


def _chart(group: str, title: str, got: Report) -> dict:
    times = got.times
    # The busiest by what the chart draws (tokens), not by the report's order (requests).
    ranked = sorted(got.groups, key=lambda g: (-_tokens(g.totals), -g.totals.requests, g.label))
    lines = [Line(f"u{i}", g.label, [(t, _tokens(p)) for t, p in zip(times, g.series, strict=True)])
             for i, g in enumerate(ranked[:SHOWN])]
    rest = ranked[SHOWN:]
    if rest:
        summed = [sum(_tokens(g.series[i]) for g in rest) for i in range(len(times))]
        lines.append(Line("rest", f"{len(rest)} more", list(zip(times, summed, strict=True)), dashed=True))
    drawn = chart(f"usage-{group}", title, "tokens", lines, got.since, got.until, got.step, size=SIZE,
                  note=f"per {_duration(got.step)}", empty_reason=NO_USAGE)
    if lines:
        drawn["empty"] = False  # a range of zeros is still a range with usage (requests without tokens)
    return drawn


def _duration(seconds: int) -> str:
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"
