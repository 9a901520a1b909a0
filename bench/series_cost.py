"""What recording charts over time costs at fleet size, in process: a fleet written straight into a fresh
database (SQLite file, or a fresh PostgreSQL database with --postgres), every replica placed on a GPU and
ready, a share of the deployments with traffic, then the series sampler (console/series/sampler.py) timed:

* first tick: every series is new (what a console pays once);
* steady: nothing changed since the last tick (what a quiet fleet pays every 10 s);
* traffic moving: the deployments with traffic change rate, latency and errors, and every connected GPU's
  used memory and utilisation move (a busy fleet, every tick);
* every figure moving: every deployment's traffic figures and every GPU's reading change (the worst case;
  replica counts stay);
* a tick closing a 5-minute window, traffic moving: the window's means are compared and written where they
  changed (the first such tick writes one per series: every series gets its first 5-minute point);
* API read: GET /api/v1/deployments/NAME/series over a day of 10-second points (8,640 of them, every one
  a change), through the Django test client;
* on disk per point: the points table and its indexes over the points stored by then.

    .venv/bin/python bench/series_cost.py --sizes 100:1000 1000:10000
    .venv/bin/python bench/series_cost.py --sizes 1000:10000 --postgres

Prints a table (median of --runs ticks each). No assertions on timings.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, median, print_header, print_table, say  # noqa: E402
from bench.pass_cost import DEFAULT_DATABASE_URL, drop_database, setup_django  # noqa: E402

GIB = 1024**3
TRAFFIC_SHARE = 0.1  # deployments with traffic


def build_fleet(tmp: Path, hosts: int, gpus: int, deployments: int) -> None:
    """Hosts with GPUs, connected; `deployments` of one ready replica each, spread over the GPUs."""
    from django.utils import timezone

    from bench.fleet import write_model
    from console.catalog.services import register_model
    from console.deployments.models import Deployment, Replica
    from console.deployments.services import create_deployment
    from console.fleet.models import Gpu, Host

    model = register_model("tiny", str(write_model(tmp / "tiny")))
    now = timezone.now()
    rows = Host.objects.bulk_create([Host(name=f"sim-{i:04d}", endpoint="http://127.0.0.1:9", connected=True,
                                          last_seen=now) for i in range(hosts)])
    gpu_rows = Gpu.objects.bulk_create([Gpu(host=h, index=g, uuid=f"SIM-{h.name}-{g}", name="sim",
                                            total_bytes=80 * GIB, used_bytes=GIB, own_bytes=GIB // 2,
                                            utilization=30.0) for h in rows for g in range(gpus)])
    first = create_deployment("d00000", "tiny", min_replicas=1, max_replicas=1)
    Replica.objects.all().delete()
    Deployment.objects.bulk_create([Deployment(name=f"d{i:05d}", model=model, estimates=first.estimates)
                                    for i in range(1, deployments)], batch_size=1000)
    deps = list(Deployment.objects.order_by("pk"))
    replicas = Replica.objects.bulk_create(
        [Replica(deployment=d, index=0, host_id=gpu_rows[i % len(gpu_rows)].host_id, reserved_bytes=2 * GIB,
                 measured_bytes=GIB + i, observed_state="ready", desired_state="ready") for i, d in enumerate(deps)],
        batch_size=1000)
    Replica.gpus.through.objects.bulk_create(
        [Replica.gpus.through(replica_id=r.pk, gpu_id=gpu_rows[i % len(gpu_rows)].pk) for i, r in enumerate(replicas)],
        batch_size=1000)


def traffic(share: float, tick: int, moving: bool = True) -> None:
    """The first `share` of the deployments get traffic figures (rate, p95, the gateway's own, renewed at
    `tick` as the gateway renews them), and every GPU a reading: new ones per tick when `moving`, else the
    same as before."""
    from django.db import transaction

    from console.deployments.models import Deployment
    from console.fleet.models import Gpu

    rng = random.Random(tick if moving else 0)
    deps = list(Deployment.objects.order_by("pk").values_list("pk", flat=True))
    chosen = deps[:max(1, int(share * len(deps)))]
    at = _clock(tick).timestamp()
    rows = []
    for pk in chosen:
        rate = round(rng.uniform(1, 100), 3)
        rows.append(Deployment(pk=pk, traffic_rps=rate, observed_p95_ms=rng.uniform(20, 400), gateway_stats={
            "c:1": {"request_rate": rate, "error_rate": rng.uniform(0, 0.05), "p50_ms": rng.uniform(5, 50),
                    "p95_ms": rng.uniform(20, 400), "queue_ms": rng.uniform(0, 30), "at": at}}))
    with transaction.atomic():
        Deployment.objects.bulk_update(rows, ["traffic_rps", "observed_p95_ms", "gateway_stats"], batch_size=500)
        gpus = [Gpu(pk=pk, used_bytes=rng.randrange(GIB, 60 * GIB), utilization=rng.uniform(0, 100))
                for pk in Gpu.objects.values_list("pk", flat=True)]
        Gpu.objects.bulk_update(gpus, ["used_bytes", "utilization"], batch_size=500)


START = (int(time.time()) - 3 * 86400) // 300 * 300  # the ticks' clock: in the past, from a window's start


def _clock(tick: int) -> datetime:
    """The sampler's time at `tick`: 10 s apart from START."""
    return datetime.fromtimestamp(START + 10 * tick, tz=UTC)


def time_ticks(label: str, first: int, runs: int, before=None) -> tuple[float, int]:
    from console.series.sampler import sample

    took, written = [], 0
    for tick in range(first, first + runs):
        if before is not None:
            before(tick)
        began = time.perf_counter()
        written = sample(_clock(tick))
        took.append(time.perf_counter() - began)
    say(f"{label}: median {1000 * median(took):.0f} ms over {runs}, {written} points in the last")
    return median(took), written


def time_read(runs: int) -> float:
    """A day of 10-second points for one deployment, ending now, every one a change, written directly; then
    the API reads that day (since a day ago, so 10-second points)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from console.deployments.models import Deployment
    from console.series.models import Clock, Point, Series

    dep = Deployment.objects.order_by("pk").first()
    end = int(time.time())
    series = Series.objects.get(kind="deployment", object_id=dep.pk, metric="p95_ms")
    Point.objects.bulk_create([Point(series=series, t=end - 10 * i, value=float(100 + i % 50))
                               for i in range(8640)], batch_size=1000)
    Clock.objects.update(last_tick=end)
    user = get_user_model().objects.create_user("bench")
    client = Client(HTTP_HOST="127.0.0.1")  # settings.ALLOWED_HOSTS
    client.force_login(user)
    url = f"/api/v1/deployments/{dep.name}/series?metric=p95_ms&since={end - 86400 + 60}"
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        response = client.get(url)
        took.append(time.perf_counter() - began)
    points = len(response.json()["points"])
    say(f"API read: median {1000 * median(took):.0f} ms for {points} points")
    return median(took), points


def point_bytes() -> str:
    """What a stored point takes on disk, its table's indexes included."""
    from django.db import connection

    from console.series.models import Point

    table = Point._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT SUM(pgsize) FROM dbstat WHERE name = %s OR name IN "
                           "(SELECT name FROM sqlite_master WHERE tbl_name = %s AND type = 'index')", [table, table])
        else:
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        size = cursor.fetchone()[0]
    count = Point.objects.count()
    return f"{size / count:.0f} B ({count:,} points)"


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--sizes", nargs="+", default=["100:1000"], help="HOSTS:DEPLOYMENTS, e.g. 1000:10000")
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--postgres", nargs="?", const=DEFAULT_DATABASE_URL, default=None,
                        help="a fresh database on this PostgreSQL server (default the local one)")
    args = parser.parse_args()
    if len(args.sizes) > 1:  # Django is set up once per process: one size per child
        import subprocess

        for size in args.sizes:
            cmd = [sys.executable, __file__, "--sizes", size, "--gpus-per-host", str(args.gpus_per_host),
                   "--runs", str(args.runs)] + (["--postgres", args.postgres] if args.postgres else [])
            subprocess.run(cmd, check=True)
        return
    print_header()
    hosts, deployments = (int(n) for n in args.sizes[0].split(":"))
    with tempfile.TemporaryDirectory(prefix="bench-series-") as tmp:
        dropped = setup_django(Path(tmp), args.postgres)
        try:
            from console.series.models import Series

            began = time.perf_counter()
            build_fleet(Path(tmp), hosts, args.gpus_per_host, deployments)
            say(f"{hosts} hosts, {deployments} deployments written in {time.perf_counter() - began:.0f} s")
            row = {"database": "PostgreSQL" if args.postgres else "SQLite",
                   "fleet": f"{hosts:,} x {args.gpus_per_host} GPUs", "deployments": f"{deployments:,}"}
            traffic(TRAFFIC_SHARE, 0)
            first, written = time_ticks("first tick", 0, 1)
            row["series"] = f"{Series.objects.count():,}"
            row["first tick"] = f"{1000 * first:.0f} ms ({written:,} rows)"
            steady, written = time_ticks("steady", 1, args.runs,
                                         before=lambda tick: traffic(TRAFFIC_SHARE, tick, moving=False))
            row["steady tick"] = f"{1000 * steady:.0f} ms ({written:,} rows)"
            moving, written = time_ticks("traffic moving", 1 + args.runs, args.runs,
                                         before=lambda tick: traffic(TRAFFIC_SHARE, tick))
            row[f"{TRAFFIC_SHARE:.0%} with traffic moving"] = f"{1000 * moving:.0f} ms ({written:,} rows)"
            worst, written = time_ticks("every figure moving", 1 + 2 * args.runs, args.runs,
                                        before=lambda tick: traffic(1.0, tick))
            row["every figure moving"] = f"{1000 * worst:.0f} ms ({written:,} rows)"
            # Ticks 30, 60 and 90 open new windows: the first 5-minute points for every series, then the means
            # that changed (window 0 saw every figure move), then those of a window of 10% traffic.
            moving_share = lambda tick: traffic(TRAFFIC_SHARE, tick)  # noqa: E731
            time_ticks("window filling", 1 + 3 * args.runs, 30 - 1 - 3 * args.runs, before=moving_share)
            first_close, written_first = time_ticks("first window closes", 30, 1, before=moving_share)
            time_ticks("window filling", 31, 59, before=moving_share)
            close, written = time_ticks("window closes", 90, 1, before=moving_share)
            row["tick closing a 5-min window"] = (f"{1000 * close:.0f} ms ({written:,} rows; the first: "
                                                  f"{1000 * first_close:.0f} ms, {written_first:,})")
            read, points = time_read(args.runs)
            row["API read, a day of 10 s points"] = f"{1000 * read:.0f} ms ({points:,} points)"
            row["on disk per point"] = point_bytes()
            print_table("Series sampler and reads, in process", [row])
        finally:
            if dropped:
                drop_database(args.postgres, dropped)


if __name__ == "__main__":
    main()
