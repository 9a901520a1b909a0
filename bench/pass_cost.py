"""What one scheduler pass costs at fleet size, in process: a fleet of hosts and deployments written straight
into a fresh database (SQLite file, or a fresh PostgreSQL database with --postgres), every replica placed by
real passes and then observed ready, then the console's own `reconcile_once` timed:

* steady pass: nothing changed since the last pass (what a settled fleet paid every tick before ticks, and what
  it pays at each resync or due time rule);
* tick: what the loop runs instead when nothing woke it and nothing is due (leases and evictions only);
* after a report: one replica's measured bytes changed (what a busy fleet pays every tick);
* after a host loss: one host evicted, its replicas re-placed;
* placing a wave: as many new one-replica deployments as hosts, placed (a bulk create's pass, once);
* gateway snapshot: the gateway's fleet snapshot (load_fleet), which every console process serving the gateway
  takes on each change of the fleet.

    .venv/bin/python bench/pass_cost.py --hosts 100 1000 --replicas-per-host 10
    .venv/bin/python bench/pass_cost.py --hosts 1000 --postgres --profile

Prints a table (median of --runs passes each: wall time, and the pass's thread's CPU time, which is what it
takes from the console's other threads under the interpreter lock) and, with --profile, the top functions of one
steady pass.
No assertions on timings.
"""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, median, print_header, print_table, say  # noqa: E402

GIB = 1024**3
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def setup_django(tmp: Path, postgres: str | None) -> str | None:
    """Point the console at a fresh database; returns the PostgreSQL database to drop afterwards."""
    os.environ["MODELGRID_DATA_DIR"] = str(tmp / "data")
    os.environ["MODELGRID_MODEL_ROOTS"] = str(tmp)
    os.environ.setdefault("MODELGRID_STRATEGY", "balance")
    os.environ.pop("REDIS_URL", None)
    name = None
    if postgres:
        import psycopg

        name = f"bench_pass_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        os.environ["DATABASE_URL"] = postgres.rsplit("/", 1)[0] + f"/{name}"
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    logging.getLogger("modelgrid").setLevel(logging.WARNING)  # a line per placement would drown the table
    return name


def drop_database(postgres: str, name: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def build_fleet(tmp: Path, hosts: int, gpus: int, replicas: int) -> None:
    """Hosts with simulated GPUs, connected; `replicas` deployments of one replica; passes until every replica
    is placed, then every replica observed ready with its measured bytes (a settled fleet)."""
    from django.utils import timezone

    from bench.fleet import write_model
    from console.catalog.services import register_model
    from console.control.reconcile import reconcile_once, start_leading
    from console.deployments.models import Deployment, Replica
    from console.deployments.services import create_deployment
    from console.fleet.models import Gpu, Host

    model = register_model("tiny", str(write_model(tmp / "tiny")))
    now = timezone.now()
    rows = Host.objects.bulk_create([Host(name=f"sim-{i:04d}", endpoint="http://127.0.0.1:9", connected=True,
                                          last_seen=now) for i in range(hosts)])
    Gpu.objects.bulk_create([Gpu(host=h, index=g, uuid=f"SIM-{h.name}-{g}", name="sim", total_bytes=80 * GIB,
                                 simulated=True) for h in rows for g in range(gpus)])
    first = create_deployment("d00000", "tiny", min_replicas=1, max_replicas=1)  # the estimates the rest copy
    Deployment.objects.bulk_create([Deployment(name=f"d{i:05d}", model=model, estimates=first.estimates,
                                               replicas=1, min_replicas=1, max_replicas=1)
                                    for i in range(1, replicas)])
    start_leading()
    for _ in range(10):
        reconcile_once()
        if not Replica.objects.filter(host__isnull=True).exists():
            break
    Replica.objects.update(observed_state="ready", measured_bytes=64 * 1024**2, pid=4242)
    reconcile_once()  # settles the states derived from observations
    Host.objects.update(last_seen=timezone.now())


def time_pass(label: str, runs: int, before=None, tick: bool = False) -> tuple[float, int]:
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    from console.control.reconcile import reconcile_once

    took, cpu, queries = [], [], 0
    for _ in range(runs):
        if before is not None:
            before()
        reset_queries()
        with CaptureQueriesContext(connection) as ctx:
            began = time.perf_counter()
            cpu.append(reconcile_once(scope="tick" if tick else "plan").cpu_s)
            took.append(time.perf_counter() - began)
        queries = len(ctx.captured_queries)
    say(f"{label}: median {1000 * median(took):.0f} ms, {1000 * median(cpu):.0f} ms of this process's CPU, over "
        f"{runs} ({queries} queries in the last)")
    return f"{1000 * median(took):.0f} ms, CPU {1000 * median(cpu):.0f} ms ({queries} queries)"


def time_snapshot(runs: int) -> str:
    """The gateway's fleet snapshot (console/gateway/fleet.load_fleet), taken on every change of the fleet: the
    first, then the median of `runs` more with one replica's state changed before each."""
    from console.deployments.models import Replica
    from console.gateway.fleet import load_fleet

    def timed() -> tuple[float, float]:
        began, cpu = time.perf_counter(), time.thread_time()
        load_fleet()
        return time.perf_counter() - began, time.thread_time() - cpu

    first, took = timed(), []
    changed = Replica.objects.filter(pk=Replica.objects.order_by("pk").values_list("pk", flat=True)[0])
    for i in range(runs):
        changed.update(observed_state="loading" if i % 2 == 0 else "ready")
        took.append(timed())
    wall, cpu = median([t for t, _ in took]), median([c for _, c in took])
    say(f"gateway snapshot: first {1000 * first[0]:.0f} ms, then median {1000 * wall:.0f} ms, {1000 * cpu:.0f} ms "
        f"of CPU, over {runs}")
    return f"{1000 * wall:.0f} ms, CPU {1000 * cpu:.0f} ms (first {1000 * first[0]:.0f} ms)"


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--hosts", type=int, nargs="+", default=[100])
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--replicas-per-host", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--postgres", nargs="?", const=DEFAULT_DATABASE_URL, default=None,
                        help="a fresh database on this PostgreSQL server (default the local one)")
    parser.add_argument("--profile", action="store_true", help="print the top functions of one steady pass")
    args = parser.parse_args()
    if len(args.hosts) > 1:  # Django is set up once per process: one size per child
        import subprocess

        for hosts in args.hosts:
            cmd = [sys.executable, __file__, "--hosts", str(hosts), "--gpus-per-host", str(args.gpus_per_host),
                   "--replicas-per-host", str(args.replicas_per_host), "--runs", str(args.runs)]
            cmd += ["--postgres", args.postgres] if args.postgres else []
            cmd += ["--profile"] if args.profile else []
            subprocess.run(cmd, check=True)
        return
    print_header()
    hosts = args.hosts[0]
    replicas = hosts * args.replicas_per_host
    with tempfile.TemporaryDirectory(prefix="bench-pass-") as tmp:
        dropped = setup_django(Path(tmp), args.postgres)
        try:
            began = time.perf_counter()
            build_fleet(Path(tmp), hosts, args.gpus_per_host, replicas)
            say(f"{hosts} hosts, {replicas} replicas placed and ready in {time.perf_counter() - began:.0f} s")
            row = {"database": "PostgreSQL" if args.postgres else "SQLite",
                   "fleet": f"{hosts} x {args.gpus_per_host} GPUs", "replicas": f"{replicas:,}"}
            row["steady pass"] = time_pass("steady", args.runs)
            row["tick (nothing woke it, nothing due)"] = time_pass("tick", args.runs, tick=True)
            row["pass after a report"] = time_pass("after a report", args.runs, before=_one_measurement())
            row["pass after a host loss"] = time_pass("after a host loss", 1, before=_lose_a_host)
            row["pass placing a wave"] = time_pass(f"placing {hosts} new deployments", 1, before=_wave(hosts))
            row["gateway snapshot"] = time_snapshot(args.runs)
            print_table("One scheduler pass (reconcile_once), in process", [row])
            if args.profile:
                profiler = cProfile.Profile()
                from console.control.reconcile import reconcile_once

                profiler.runcall(reconcile_once)
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
                pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
        finally:
            if dropped:
                drop_database(args.postgres, dropped)


def _one_measurement():
    from console.deployments.models import Replica

    counter = iter(range(1, 10**9))

    def change() -> None:
        first = Replica.objects.order_by("pk").first()
        Replica.objects.filter(pk=first.pk).update(measured_bytes=64 * 1024**2 + next(counter))

    return change


def _wave(count: int):
    """`count` new one-replica deployments, as a bulk create makes them (the fleet benchmark's waves)."""
    from console.deployments.models import Deployment

    def create() -> None:
        first = Deployment.objects.order_by("pk").first()
        Deployment.objects.bulk_create([Deployment(name=f"w{i:05d}", model=first.model, estimates=first.estimates,
                                                   replicas=1, min_replicas=1, max_replicas=1) for i in range(count)])

    return create


def _lose_a_host() -> None:
    from django.utils import timezone

    from console.fleet.models import Host

    victim = Host.objects.filter(replicas__isnull=False).order_by("pk").first()
    Host.objects.filter(pk=victim.pk).update(connected=False, evicted_at=timezone.now(), unknown_since=timezone.now())


if __name__ == "__main__":
    main()
