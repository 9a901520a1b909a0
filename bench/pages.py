"""Pages and REST lists at fleet scale (issue 12). Prints one table; no assertions on timings.

    .venv/bin/python bench/pages.py                       # 1,000 hosts x 8 GPUs, 10,000 replicas, SQLite
    .venv/bin/python bench/pages.py --hosts 100 --replicas 1000
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_pages .venv/bin/python bench/pages.py

The rows are written straight into a fresh database (bulk_create; no agents, no scheduler): hosts of 8
GPUs of 80 GiB (95% connected, 3% unknown, 2% offline), deployments of 4 replicas each on one GPU apiece,
most ready, some loading or asleep. Then each request is timed with Django's test client in this process
(a signed-in user for the page, an API token for the REST calls): the first (cold), the median and
minimum of --repeat warm ones and their CPU time, with the SQL queries it ran and the response's size;
then one bulk creation of --bulk deployments, and the same request again (refused: the names are taken).
A DATABASE_URL database is dropped and recreated first: name a scratch one.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, print_header, print_table, say  # noqa: E402

GIB = 1 << 30
GPUS_PER_HOST = 8
REPLICAS_PER_DEPLOYMENT = 4

REQUESTS = (
    ("page", "GET /"),
    ("page", "GET /?page=7&q=host-00&state=connected"),
    ("api", "GET /api/v1/deployments?page=1"),
    ("api", "GET /api/v1/deployments?page=10&per_page=100&state=ready"),
    ("api", "GET /api/v1/hosts?page=1"),
    ("api", "GET /api/v1/models?page=1"),
)


def setup_django(database_url: str | None) -> None:
    os.environ.pop("REDIS_URL", None)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("MODELGRID_DATA_DIR", tempfile.mkdtemp(prefix="bench-pages-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's host, and a renderer that does not need collectstatic


def fresh_database(database_url: str | None) -> None:
    from django.core.management import call_command
    from django.db import connection

    if database_url:  # a scratch PostgreSQL database: drop and recreate it through the server's own database
        import psycopg

        name = connection.settings_dict["NAME"]
        params = {k: v for k, v in {"host": connection.settings_dict["HOST"],
                                    "port": connection.settings_dict["PORT"] or None,
                                    "user": connection.settings_dict["USER"]}.items() if v}
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)


def seed(hosts: int, replicas: int) -> None:
    """The fleet, written in a few bulk inserts."""
    from django.db import transaction
    from django.utils import timezone

    from console.catalog.models import Model
    from console.deployments.models import Deployment, Replica
    from console.fleet.models import Gpu, Host

    now = timezone.now()
    with transaction.atomic():
        models = Model.objects.bulk_create(
            Model(name=f"model-{i:02d}", path=f"/models/m{i}", architecture="LlamaForCausalLM", model_type="llama",
                  task="generate", stored_dtype="bfloat16", parameters=7_000_000_000, weights_bytes=14 * GIB,
                  estimate_bytes=16 * GIB, estimate={"total_bytes": 16 * GIB}) for i in range(20))
        host_rows = []
        for i in range(hosts):
            state = "connected" if i % 100 < 95 else ("unknown" if i % 100 < 98 else "offline")
            host_rows.append(Host(
                name=f"host-{i:04d}", endpoint=f"http://10.0.{i // 250}.{i % 250}:8100", agent_version="0.4.0",
                connected=state == "connected", last_seen=now, generation=i, acked_generation=i,
                unknown_since=None if state == "connected" else now - timedelta(minutes=3),
                evicted_at=now if state == "offline" else None, labels={"zone": f"eu-{i % 4}"},
                ram_free_bytes=64 * GIB))
        host_rows = Host.objects.bulk_create(host_rows)
        gpus = Gpu.objects.bulk_create(
            Gpu(host=h, index=g, uuid=f"GPU-{h.name}-{g}", name="NVIDIA H100 80GB HBM3", total_bytes=80 * GIB,
                used_bytes=30 * GIB, utilization=50) for h in host_rows for g in range(GPUS_PER_HOST))
        n_deployments = max(1, replicas // REPLICAS_PER_DEPLOYMENT)
        states = ("ready", "ready", "ready", "loading", "degraded", "pending")
        deployments = Deployment.objects.bulk_create(
            Deployment(name=f"dep-{i:05d}", model=models[i % len(models)], replicas=REPLICAS_PER_DEPLOYMENT,
                       min_replicas=REPLICAS_PER_DEPLOYMENT, max_replicas=REPLICAS_PER_DEPLOYMENT,
                       priority=("critical", "high", "standard", "batch")[i % 4], state=states[i % len(states)],
                       slo_latency_ms=200 if i % 3 == 0 else None, traffic_rps=1.5, estimates={},
                       reason="all replicas placed") for i in range(n_deployments))
        rows, placed = [], []
        for i in range(replicas):
            dep = deployments[i // REPLICAS_PER_DEPLOYMENT]
            gpu = gpus[(i * 7) % len(gpus)]
            asleep = i % 50 == 0
            rows.append(Replica(
                deployment=dep, index=i % REPLICAS_PER_DEPLOYMENT, host_id=gpu.host_id, reserved_bytes=16 * GIB,
                reservation={"device": "cuda", "estimated_bytes": 15 * GIB, "calibrated_from": 4},
                desired_state="sleeping" if asleep else "ready",
                observed_state="sleeping" if asleep else ("loading" if i % 17 == 0 else "ready"),
                measured_bytes=15 * GIB, loaded_bytes=GIB, loading_total_bytes=14 * GIB, action="keep",
                reason=f"kept on {gpu.host_id}/{gpu.index}: it still fits", host_bytes=15 * GIB if asleep else None))
            placed.append(gpu)
        rows = Replica.objects.bulk_create(rows, batch_size=2000)
        through = Replica.gpus.through
        through.objects.bulk_create((through(replica_id=r.pk, gpu_id=g.pk) for r, g in zip(rows, placed,
                                                                                          strict=True)),
                                    batch_size=5000)


def clients():
    from django.contrib.auth import get_user_model
    from django.test import Client

    from console.accounts.models import ApiToken

    user = get_user_model().objects.create_user("bench", password="bench-password-123")
    page = Client()
    page.force_login(user)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(user)[1]}")
    return {"page": page, "api": api}


def time_request(client, url: str, repeat: int) -> dict:
    from django.db import connection

    statements = []

    def count(execute, sql, params, many, context):
        # Counted here rather than with CaptureQueriesContext, whose log keeps only the last 9,000.
        statements.append(1)
        return execute(sql, params, many, context)

    times, cpu, queries, size = [], [], 0, 0
    for _ in range(repeat + 1):
        statements.clear()
        with connection.execute_wrapper(count):
            t0, c0 = time.perf_counter(), time.process_time()
            response = client.get(url)
            elapsed, used = time.perf_counter() - t0, time.process_time() - c0
        if response.status_code != 200:
            raise SystemExit(f"{url}: {response.status_code} {response.content[:300]!r}")
        times.append(elapsed)
        cpu.append(used)
        queries, size = len(statements), len(response.content)
    return {"cold ms": 1000 * times[0], "median ms": 1000 * statistics.median(times[1:] or times),
            "min ms": 1000 * min(times[1:] or times), "cpu ms": 1000 * statistics.median(cpu[1:] or cpu),
            "queries": queries, "KiB": round(size / 1024)}


def time_bulk(client, count: int) -> dict:
    """POST /api/v1/deployments/bulk of `count` deployments of one small real model (its estimate is read
    from its files), then the same again to time a refusal: every name is taken by then."""
    import json

    from django.conf import settings
    from django.db import connection

    from console.catalog.services import register_model
    from tests.conftest import write_model_dir

    root = Path(tempfile.mkdtemp(prefix="bench-pages-models-"))
    settings.MODEL_ROOTS = [root.resolve()]
    register_model("bench-tiny", str(write_model_dir(root / "tiny")))
    body = json.dumps({"deployments": [{"name": f"bulk-{i:04d}", "model": "bench-tiny", "replicas": 1}
                                       for i in range(count)]})
    rows, statements = [], []

    def counted(execute, *args):
        statements.append(1)
        return execute(*args)

    for label, status in (("created", 201), ("refused: every name taken", 409)):
        statements.clear()
        with connection.execute_wrapper(counted):
            t0, c0 = time.perf_counter(), time.process_time()
            response = client.post("/api/v1/deployments/bulk", data=body, content_type="application/json")
            elapsed, used = time.perf_counter() - t0, time.process_time() - c0
        if response.status_code != status:
            raise SystemExit(f"bulk: {response.status_code} {response.content[:300]!r}")
        rows.append({"request": f"POST /api/v1/deployments/bulk ({count:,}, {label})", "cold ms": 1000 * elapsed,
                     "cpu ms": 1000 * used, "queries": len(statements), "KiB": round(len(response.content) / 1024)})
    return rows


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5, help="warm requests per URL (median)")
    parser.add_argument("--bulk", type=int, default=1000, help="deployments in the timed bulk creation (0: none)")
    args = parser.parse_args()
    print_header()
    database_url = os.environ.get("DATABASE_URL")
    setup_django(database_url)
    from django.db import connection


    fresh_database(database_url)
    t0 = time.perf_counter()
    seed(args.hosts, args.replicas)
    say(f"seeded {args.hosts} hosts x {GPUS_PER_HOST} GPUs, {args.replicas} replicas in "
        f"{time.perf_counter() - t0:.1f} s ({connection.vendor})")
    by_kind = clients()
    rows = []
    for kind, request in REQUESTS:
        url = request.split(" ", 1)[1]
        rows.append({"request": request} | time_request(by_kind[kind], url, args.repeat))
        say(f"{request}: {rows[-1]['median ms']:.0f} ms")
    if args.bulk:
        rows += time_bulk(by_kind["api"], args.bulk)
    print_table(f"{args.hosts} hosts x {GPUS_PER_HOST} GPUs, {args.replicas} replicas, {connection.vendor} "
                f"(Django test client, in process)", rows,
                notes=(f"cold: the first request (the only one for the bulk creation); median and min of "
                       f"{args.repeat} after it; cpu: this process's "
                       "CPU time (median), steadier than wall time on a busy machine (SQLite runs in process, so "
                       "it counts too). queries: SQL statements of one request. KiB: the response body.",))


if __name__ == "__main__":
    main()
