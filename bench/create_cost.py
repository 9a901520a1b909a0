"""What creating deployments in bulk costs the console, in process: a fresh database (SQLite file, or a fresh
PostgreSQL database with --postgres), one tiny model registered, then POST /api/v1/deployments/bulk through
Django's test client, each POST timed whole (parsing, checks, the insert, the events, the answer); and record()
of a pass's worth of events (what a pass that placed that many replicas writes to the timeline).

A bulk create runs on one of the console's threads, and while it runs it holds the interpreter lock most of the
time: in a 1,000-host wave the creates were a sixth of the lock's time (docs/benchmarks.md).

    .venv/bin/python bench/create_cost.py --postgres
    .venv/bin/python bench/create_cost.py --size 1000 --posts 8 --events 8000 --postgres --profile

Prints a table (median of the POSTs after the first, and of the record() calls). No assertions on timings.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, median, print_header, print_table  # noqa: E402
from bench.pass_cost import DEFAULT_DATABASE_URL, drop_database, setup_django  # noqa: E402


def time_bulk_posts(tmp: Path, size: int, posts: int, profile: bool) -> list[float]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from bench.fleet import write_model
    from console.accounts.models import ApiToken
    from console.catalog.services import register_model

    register_model("tiny", str(write_model(tmp / "tiny")))
    token = ApiToken.issue(get_user_model().objects.create_user("bench", password="unused-password-123"))[1]
    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {token}")
    took = []
    for post in range(posts):
        body = json.dumps({"deployments": [{"name": f"d{post:03d}-{i:05d}", "model": "tiny", "replicas": 1}
                                           for i in range(size)]})
        profiler = cProfile.Profile() if profile and post == posts - 1 else None
        began = time.perf_counter()
        if profiler:
            profiler.enable()
        answer = client.post("/api/v1/deployments/bulk", body, content_type="application/json")
        took.append(time.perf_counter() - began)
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        if answer.status_code != 201:
            raise RuntimeError(f"POST /deployments/bulk answered {answer.status_code}: {answer.content[:300]!r}")
    return took


def time_records(events: int, runs: int) -> list[float]:
    from django.db import transaction

    from console.events.record import Note, record

    took = []
    for run in range(runs):
        notes = [Note(f"replica/r{run}-{i:05d}#0", "Placed", f"on sim-{i % 1000:04d} GPU 0 (it fits)",
                      actor="scheduler", deployment=f"r{run}-{i:05d}", host=f"sim-{i % 1000:04d}")
                 for i in range(events)]
        with transaction.atomic():
            began = time.perf_counter()
            record(notes)
            took.append(time.perf_counter() - began)
    return took


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--size", type=int, default=1000, help="deployments per bulk POST")
    parser.add_argument("--posts", type=int, default=8)
    parser.add_argument("--events", type=int, default=8000, help="notes per record() call")
    parser.add_argument("--runs", type=int, default=5, help="record() calls")
    parser.add_argument("--postgres", nargs="?", const=DEFAULT_DATABASE_URL, default=None,
                        help="a fresh database on this PostgreSQL server (default the local one)")
    parser.add_argument("--profile", action="store_true", help="print the top functions of the last POST")
    args = parser.parse_args()
    print_header()
    with tempfile.TemporaryDirectory(prefix="bench-create-") as tmp:
        dropped = setup_django(Path(tmp), args.postgres)
        try:
            posts = time_bulk_posts(Path(tmp), args.size, args.posts, args.profile)
            records = time_records(args.events, args.runs)
            print_table("Bulk creates and event writes, in process", [{
                "database": "PostgreSQL" if args.postgres else "SQLite",
                f"bulk POST of {args.size:,} (median of {len(posts) - 1} after the first)":
                    f"{1000 * median(posts[1:]):.0f} ms",
                "first POST": f"{1000 * posts[0]:.0f} ms",
                f"record() of {args.events:,} notes (median of {args.runs})": f"{1000 * median(records):.0f} ms",
            }])
        finally:
            if dropped:
                drop_database(args.postgres, dropped)


if __name__ == "__main__":
    main()
