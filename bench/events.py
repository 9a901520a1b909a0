"""The event timeline at scale (issue 13). Prints tables; no assertions on timings.

    .venv/bin/python bench/events.py                                   # 10,000 and 100,000 events, SQLite
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_events .venv/bin/python bench/events.py

Events are written with the console's own `record()` in batches of 100, as a scheduler pass or an intake tick
writes them (objects spread over 1,000 deployments of 4 replicas and 250 hosts; one in ten a repeat that is
folded). Then `GET /api/v1/events` pages through the whole timeline by its cursor with Django's test client
in this process (an API token), unfiltered and filtered to one deployment, timing every page: median, p95
and slowest, with the page's SQL queries. A DATABASE_URL database is dropped and recreated first: name a
scratch one.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, percentile, print_header, print_table  # noqa: E402
from bench.pages import fresh_database, setup_django  # noqa: E402  (the same fresh database as the pages benchmark)

BATCH = 100


def write(n: int) -> float:
    """Append n distinct events through record(), and one repeat (folded) for every ten; returns the seconds it
    took."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from console.events.record import Note, record

    reasons = ("Placed", "Loading", "Ready", "Preempted", "Failed", "Woken", "Slept")
    start = timezone.now() - timedelta(hours=2)
    began = time.perf_counter()
    for b in range(0, n, BATCH):
        notes = []
        for i in range(b, min(b + BATCH, n)):
            dep, index, host, reason = f"dep-{i % 1000:04d}", (i // 1000) % 4, f"host-{i % 250:03d}", reasons[i % 7]
            note = Note(f"replica/{dep}#{index}", reason, f"{reason.lower()} on {host}/0 (event {i})",
                        warning=reason in ("Preempted", "Failed"), actor="scheduler", deployment=dep, host=host)
            notes += [note, note] if i % 10 == 9 else [note]
        with transaction.atomic():
            record(notes, start + timedelta(milliseconds=b))
    return time.perf_counter() - began


def page_through(client, auth: dict, query: str, limit: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times, queries, events, cursor, pages = [], 0, 0, "", 0
    while True:
        url = f"/api/v1/events?limit={limit}{query}" + (f"&cursor={cursor}" if cursor else "")
        with CaptureQueriesContext(connection) as ctx:
            t0 = time.perf_counter()
            r = client.get(url, **auth)
            times.append(1000 * (time.perf_counter() - t0))
        assert r.status_code == 200, r.content
        body = r.json()
        pages += 1
        queries = max(queries, len(ctx.captured_queries))
        events += len(body["events"])
        cursor = body["next"]
        if not cursor:
            break
    return {"pages": pages, "events": events, "median": statistics.median(times), "p95": percentile(times, 0.95),
            "max": max(times), "queries": queries}


def main() -> None:
    parser = command_line(__doc__, whole_doc=True)
    parser.add_argument("--events", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    import os

    url = args.database_url or os.environ.get("DATABASE_URL")
    setup_django(url)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from console.accounts.models import ApiToken
    from console.events.models import Event

    print_header(f"database: {connection.vendor}")
    rows = []
    for n in args.events:
        fresh_database(url)
        settings.MODELGRID_EVENTS_MAX_ROWS = max(n * 2, 100)
        token = ApiToken.issue(get_user_model().objects.get_or_create(username="bench")[0])[1]
        Event.objects.all().delete()  # the token's own event
        wrote = write(n)
        count = Event.objects.count()
        client = Client()
        auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        listings = (("all", "", 100), ("all", "", 500), ("one deployment", "&object=deployment/dep-0007", 100),
                    ("one host", "&object=host/host-007", 100), ("warnings", "&type=Warning", 100))
        for label, query, limit in listings:
            s = page_through(client, auth, query, limit)
            rows.append({"distinct events (+ 1 in 10 repeated)": f"{n:,}", "rows": f"{count:,}",
                         "write (record, batches of 100)": f"{wrote:.1f} s ({n / wrote:,.0f}/s)",
                         "listing": f"{label} ({s['events']:,})", "limit": limit, "pages": s["pages"],
                         "median page": f"{s['median']:.1f} ms", "p95 page": f"{s['p95']:.1f} ms",
                         "slowest page": f"{s['max']:.1f} ms", "queries per page": s["queries"]})
    print_table(None, rows)


if __name__ == "__main__":
    main()
