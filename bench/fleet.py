"""Fleet benchmark: one real console (`manage.py up --no-agent`) against N simulated agents (bench/fleet_sim.py)
speaking the real protocol from this process. Prints one table per fleet size. No assertions on timings.

    .venv/bin/python bench/fleet.py --quick                          # 20 hosts, 100 replicas, about a minute
    .venv/bin/python bench/fleet.py --hosts 100 --replicas 1000      # the issue's first row (PostgreSQL + Redis)
    .venv/bin/python bench/fleet.py --hosts 100 300 --replicas-per-host 10 --profile
    .venv/bin/python bench/fleet.py --sqlite --quick                 # SQLite and the in-memory channel layer
    .venv/bin/python bench/fleet.py --hosts 1000 --bulk 1000         # created as a script would: 1,000 per POST
    .venv/bin/python bench/fleet.py --hosts 1000 --scheduler-process # the scheduler in a child process of `up`
    .venv/bin/python bench/fleet.py --hosts 1000 --sim-processes 4   # the simulated agents in 4 processes

Per fleet size: a fresh data dir and (default) a fresh PostgreSQL database with the Redis channel layer
(DATABASE_URL / REDIS_URL, default the local ones), agent tokens issued in one `manage.py shell`, one tiny
model registered, the fleet connected, then deployments of 1 replica each (`--replicas-per-deployment`)
created through the REST API. Columns:

* all ready after last create: from the last POST /deployments answering to the fleet running exactly what
  was asked: every replica ready on one host and nothing else starting, loading or left behind by a move (the
  simulated agents know when each replica they run became ready); "not converged" past --timeout.
* console shows all ready: from the last create to the console's database showing every replica observed ready
  (polled every second, same deadline): the agents' view above plus the console's intake backlog.
* every deployment ready: from the last create to every deployment's own state (derived from its replicas' by
  the scheduler's passes; what GET /api/v1/deployments says) being ready, polled after the column before.
* console CPU: the console process tree over --steady seconds after convergence (every deployment ready), or
  after the timeout, in % of one core; PostgreSQL's backends for its database beside it.
* push -> ack p99 (PostgreSQL only): for each generation the scheduler gives a host, from the moment its
  commit becomes visible to the moment the console has recorded an ack of it. Both moments come from a
  trigger on fleet_host installed in the benchmark's own database (pg_notify, delivered at commit).
* push -> ack p99 by wave: the same, for each pass that gave at least half the fleet a new generation at once (a
  rollout's waves, in order): which wave misses, the first or a later one that meets the readings of those before.
* push -> ack, lone changes: the same, for --lone-changes deployments changed one at a time on the settled
  fleet (PATCH max_batch_size, half a second apart): one host's new generation each, outside a wave.
* simulator loop lag p99 / max: how late this process's event loop ran (a 10 ms sleep's overshoot) from the
  first create to convergence. All simulated agents share that loop, so a wave's pushes are parsed, converged and
  acked one after another here, where real agents answer at once; both push -> ack legs include this wait.
  With --sim-processes N the agents are spread over N processes (bench/fleet_procs.py), each with its own loop
  (the column then covers all of them), and the simulator's CPU is theirs and this process's.
* falsely offline: hosts the console marked not connected while their simulated agent's link was up; taken
  away: ready replicas the console told an agent to stop although nothing was deleted (moves).
* GET / and GET /api/v1/deployments?page=1: median of 3 after the steady window, with the fleet running.
* Python calibration before / after: the median milliseconds of a fixed piece of interpreter work, timed in this
  process before the console starts and after it stopped (bench/harness.python_speed). The same code's timings
  move with it from day to day, and this machine's moves within minutes (12-26 ms between runs of one day);
  CPU steal while converging: the share of every core the hypervisor gave other guests meanwhile.

--profile runs the console under a sampling profiler (bench/fleet_profile.py) and prints where its threads spent
their time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from bench.fleet_procs import ProcessFleet  # noqa: E402
from bench.fleet_profile import (  # noqa: E402
    PROFILE_WRITE_S,
    print_profile,
    profile_between,
    profile_env,
    read_profile,
)
from bench.fleet_sim import GIB, SimFleet, SimSpec  # noqa: E402
from bench.fleet_watch import HostWatch  # noqa: E402
from bench.harness import (  # noqa: E402
    command_line,
    cpu_seconds,
    cpu_steal,
    median,
    percentile,
    print_header,
    print_table,
    python_speed,
    running_stack,
    say,
)
from bench.sim_loop import collector_paused, run_loop  # noqa: E402
from console.gctune import tune  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


# -- the console side ----------------------------------------------------------------------------------------


def write_model(path: Path) -> Path:
    """A tiny Llama directory (config.json + safetensors, written with numpy) the console can register."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    hidden, vocab = 16, 32
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden, "vocab_size": vocab,
        "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 2 * hidden,
        "max_position_embeddings": 256}))
    save_file({"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float32),
               "model.layers.0.mlp.up_proj.weight": np.zeros((2 * hidden, hidden), np.float32)},
              str(path / "model.safetensors"))
    return path


def issue_tokens(stack, hosts: int) -> dict[str, str]:
    """Agent tokens for sim-0000.. in one Django process (AgentCredential.issue), as {host: token}."""
    code = ("import json; from console.fleet.models import AgentCredential as C; "
            f"names = [f'sim-{{i:04d}}' for i in range({hosts})]; "
            "print(json.dumps({n: C.issue(n)[1] for n in names}))")
    return json.loads(stack.manage("shell", "-c", code).splitlines()[-1])


def login(url: str, password: str) -> httpx.Client:
    """A client signed in as the admin (the pages need a session)."""
    from tests.e2e.stack import ADMIN_PASSWORD

    client = httpx.Client(base_url=url.rstrip("/"), timeout=120, follow_redirects=True)
    client.get("/accounts/login/")
    r = client.post("/accounts/login/", data={"username": "admin", "password": password or ADMIN_PASSWORD,
                                              "csrfmiddlewaretoken": client.cookies.get("csrftoken", "")})
    if "sessionid" not in client.cookies:
        raise RuntimeError(f"cannot sign in as admin: HTTP {r.status_code}")
    return client


def console_ready(env: dict, table: str = "replica") -> int:
    """Replicas the console's database shows as observed ready (what the API and the pages would show), or with
    `table` "deployment" the deployments whose derived state is ready (what GET /api/v1/deployments says)."""
    query = {"replica": "SELECT count(*) FROM deployments_replica WHERE observed_state = 'ready'",
             "deployment": "SELECT count(*) FROM deployments_deployment WHERE state = 'ready'"}[table]
    url = env.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute(query).fetchone()[0]
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{Path(env['MODELGRID_DATA_DIR']) / 'modelgrid.sqlite3'}?mode=ro",
                                            uri=True, timeout=5)) as conn:
        return conn.execute(query).fetchone()[0]


def postgres_cpu_seconds() -> float | None:
    """CPU seconds of the local PostgreSQL cluster: its live processes plus what the postmaster has reaped (the
    console opens a backend per request, conn_max_age=0, so most backends are gone before a window ends).
    Every database's share: other work on this machine counts too. None where no postgres process is seen."""
    total, seen = 0.0, False
    for p in psutil.process_iter(["username", "ppid"]):
        if p.info["username"] != "postgres":
            continue
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
            seen = True
            if p.info["ppid"] == 1 or p.parent() is None or p.parent().username() != "postgres":
                total += t.children_user + t.children_system
    return total if seen else None


def console_procs(stack) -> list[psutil.Process]:
    return [psutil.Process(stack.proc.pid), *stack.descendants()]


# -- one fleet size ------------------------------------------------------------------------------------------


@dataclass
class Run:
    hosts: int
    replicas: int
    row: dict = field(default_factory=dict)
    profile: Path | None = None
    phases: dict[str, dict | None] = field(default_factory=dict)  # phase -> the samples taken during it


async def create_deployments(url: str, token: str, count: int, per: int, concurrency: int,
                             bulk: int = 0) -> tuple[float, float]:
    """POST count deployments (per replicas each), one per request or (bulk) that many per POST /deployments/bulk;
    returns (first POST sent, last POST answered) monotonic."""
    size = bulk or 1
    chunks = iter(range(0, count, size))
    first = time.monotonic()
    last = first
    async with httpx.AsyncClient(base_url=url.rstrip("/") + "/api/v1", timeout=300,
                                 headers={"Authorization": f"Bearer {token}"}) as api:
        async def worker() -> None:
            nonlocal last
            for start in chunks:
                items = [{"name": f"fleet-{i:05d}", "model": "tiny", "replicas": per}
                         for i in range(start, min(start + size, count))]
                if bulk:
                    r = await api.post("/deployments/bulk", json={"deployments": items})
                else:
                    r = await api.post("/deployments", json=items[0])
                if r.status_code != 201:
                    raise RuntimeError(f"POST /deployments{'/bulk' if bulk else ''} {items[0]['name']}...: "
                                       f"{r.status_code} {r.text[:300]}")
                last = time.monotonic()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return first, last


def time_get(client: httpx.Client, path: str, runs: int = 3) -> float:
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        r = client.get(path)
        took.append(time.perf_counter() - began)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path}: HTTP {r.status_code}")
    return median(took)


async def measure(stack, fleet: SimFleet | ProcessFleet, watch: HostWatch, args, run: Run) -> None:
    row = run.row
    total = run.replicas
    deployments = total // args.replicas_per_deployment
    began = time.monotonic()
    if not await fleet.wait_for(lambda: fleet.connected() == run.hosts, args.timeout):
        raise RuntimeError(f"only {fleet.connected()} of {run.hosts} agents connected in {args.timeout:.0f} s")
    row["all connected"] = f"{time.monotonic() - began:.1f} s"
    say(f"{run.hosts} agents connected in {time.monotonic() - began:.1f} s; creating {deployments} deployments")
    await asyncio.sleep(3)  # their first reports land before the deployments do
    cpu_before, steal_before = cpu_seconds(console_procs(stack)), cpu_steal()
    p0 = read_profile(run.profile)
    first, last = await create_deployments(stack.url, stack.token, deployments, args.replicas_per_deployment,
                                           args.create_concurrency, args.bulk)
    row["create (POSTs)"] = f"{last - first:.1f} s" + (f" ({args.bulk} per bulk POST)" if args.bulk else "")
    say(f"created {deployments} deployments in {last - first:.1f} s")
    deadline = last + args.timeout
    next_note = time.monotonic()
    def settled() -> bool:  # every replica ready on exactly one host, nothing else running (no move in flight)
        # The counts first: the map of ready times (10,000 entries, every 0.2 s, on the simulator's loop) only then.
        return fleet.states() == {"ready": total} and len(fleet.ready()) == total

    while time.monotonic() < deadline:
        await fleet.refresh()
        if settled():
            break
        if time.monotonic() >= next_note:
            say(f"{len(fleet.ready())}/{total} ready; replicas by state {fleet.states()}; "
                f"{fleet.connected()}/{run.hosts} connected")
            next_note += 10
        await asyncio.sleep(0.2)
    ready = fleet.ready()
    converged = settled()
    # The console's own view lags the agents' by its intake backlog: wait (same deadline) until it shows them.
    seen = 0
    while converged and time.monotonic() < deadline:
        if (seen := await asyncio.to_thread(console_ready, stack.env)) >= total:
            break
        await asyncio.sleep(1)
    row["console shows all ready"] = (f"{time.monotonic() - last:.1f} s" if converged and seen >= total
                                      else f"no ({seen}/{total})")
    # ... and then every deployment's own state (derived by the scheduler's passes from its replicas' states).
    states = 0
    while converged and seen >= total and time.monotonic() < deadline:
        if (states := await asyncio.to_thread(console_ready, stack.env, "deployment")) >= deployments:
            break
        await asyncio.sleep(1)
    row["every deployment ready"] = (f"{time.monotonic() - last:.1f} s" if converged and states >= deployments
                                     else f"no ({states}/{deployments})")
    converge_end = time.monotonic()
    run.phases["creating and converging"] = profile_between(p0, read_profile(run.profile))
    row["all ready after last create"] = (f"{max(ready.values()) - last:.1f} s" if converged
                                          else f"not converged ({len(ready)}/{total} in {args.timeout:.0f} s)")
    if converged and seen >= total:  # the console's intake backlog: how far its API is behind the agents
        behind = float(row["console shows all ready"][:-2]) - (max(ready.values()) - last)
        row["API behind the agents"] = f"{behind:.1f} s"
    if converged:
        row["after first create"] = f"{max(ready.values()) - first:.1f} s"
    busy = cpu_seconds(console_procs(stack)) - cpu_before
    row["console CPU while converging"] = f"{100 * busy / (converge_end - first):.0f}%"
    if steal_before is not None:  # the hypervisor running other guests on this machine's cores meanwhile
        stolen = cpu_steal() - steal_before
        row["CPU steal while converging"] = f"{100 * stolen / ((converge_end - first) * os.cpu_count()):.0f}%"
    say(row["all ready after last create"] + f"; measuring steady CPU for {args.steady:.0f} s")
    await asyncio.sleep(3)  # the last statuses' effects
    console, simulator = console_procs(stack), [psutil.Process(), *fleet.processes()]
    pg = not args.sqlite
    c0, b0, s0, t0 = cpu_seconds(console), pg and postgres_cpu_seconds(), cpu_seconds(simulator), time.monotonic()
    p2 = read_profile(run.profile)
    await asyncio.sleep(args.steady)
    c1, b1, s1, t1 = cpu_seconds(console), pg and postgres_cpu_seconds(), cpu_seconds(simulator), time.monotonic()
    run.phases["steady" if converged else "after the timeout"] = profile_between(p2, read_profile(run.profile))
    # Others' work on this machine skews every timing here: say how busy it was.
    row[f"load avg ({os.cpu_count()} cores)"] = f"{os.getloadavg()[0]:.1f}"
    row["steady console CPU"] = f"{100 * (c1 - c0) / (t1 - t0):.0f}%" + ("" if converged else " (not converged)")
    if b0 is not None and b1 is not None and pg:
        row["postgres CPU"] = f"{100 * (b1 - b0) / (t1 - t0):.0f}%"
    row["simulator CPU"] = f"{100 * (s1 - s0) / (t1 - t0):.0f}%"
    await fleet.collect()  # the agents' metrics (their loops' lag included) up to here
    if watch.precise:
        latencies, never = watch.push_to_ack(since=first)
        row["push -> ack p50 / p99"] = (f"{1000 * percentile(latencies, 0.5):.0f} / "
                                        f"{1000 * percentile(latencies, 0.99):.0f} ms")
        row["generations not acked"] = never
        waves = watch.waves(since=first, least=max(run.hosts // 2, 1))
        row["push -> ack p99 by wave"] = (" / ".join(f"{1000 * percentile(w, 0.99):.0f}" for _, w in waves) + " ms"
                                          if waves else "")
        to_agent, to_commit = watch.legs(first, fleet.agents)
        if to_agent and to_commit:
            row["commit -> agent p50 / p99"] = (f"{1000 * percentile(to_agent, 0.5):.0f} / "
                                                f"{1000 * percentile(to_agent, 0.99):.0f} ms")
            row["ack -> commit p50 / p99"] = (f"{1000 * percentile(to_commit, 0.5):.0f} / "
                                              f"{1000 * percentile(to_commit, 0.99):.0f} ms")
    acks = [acked - received for a in fleet.agents.values() for _, received, acked in a.metrics.acks]
    row["agent apply p99"] = f"{1000 * percentile(acks, 0.99):.1f} ms"
    lag = [late for at, late in fleet.loop_lag if first <= at <= converge_end]
    if lag:
        row["simulator loop lag p99 / max"] = (f"{1000 * percentile(lag, 0.99):.0f} / "
                                               f"{1000 * max(lag):.0f} ms")
    row["falsely offline"] = falsely_offline(watch, fleet)
    row["link losses"] = sum(a.metrics.link_losses for a in fleet.agents.values())
    reasons = sum((a.metrics.loss_reasons for a in fleet.agents.values()), collections.Counter())
    if reasons:
        say("link losses by reason: " + ", ".join(f"{why}: {n}" for why, n in reasons.most_common()))
    row["taken away"] = sum(a.metrics.taken_away for a in fleet.agents.values())
    row["links superseded"] = sum(n for why, n in reasons.items() if "4409" in why)
    row["deadlocks in the console's log"] = sum("deadlock detected" in line for line in stack.lines)
    errors = [e for a in fleet.agents.values() for e in a.metrics.errors]
    row["console errors"] = len(errors)
    if errors:
        say(f"console error replies, first: {errors[0]!r}")
    api = stack.api()
    api.timeout = httpx.Timeout(300)
    p4 = read_profile(run.profile)
    row["GET /api/v1/deployments?page=1"] = f"{1000 * time_get(api, '/deployments?page=1'):.0f} ms"
    with contextlib.closing(login(stack.url, stack.env.get("MODELGRID_ADMIN_PASSWORD", ""))) as browser:
        row["GET /"] = f"{1000 * time_get(browser, '/'):.0f} ms"
    await asyncio.sleep(PROFILE_WRITE_S + 0.5)
    run.phases["the page and API GETs"] = profile_between(p4, read_profile(run.profile))
    if watch.precise and args.lone_changes:
        await lone_changes(stack, deployments, args.lone_changes, watch, row)


async def lone_changes(stack, deployments: int, count: int, watch: HostWatch, row: dict) -> None:
    """One deployment's serving setting changed at a time, half a second apart, on the settled fleet: each a new
    generation for one host (each on a host of its own here), its push -> ack timed as above (outside a
    convergence wave)."""
    since = time.monotonic()
    async with httpx.AsyncClient(base_url=stack.url.rstrip("/") + "/api/v1", timeout=60,
                                 headers={"Authorization": f"Bearer {stack.token}"}) as api:
        for k in range(count):
            name = f"fleet-{(k * 37) % deployments:05d}"
            r = await api.patch(f"/deployments/{name}", json={"max_batch_size": 100 + k})
            if r.status_code != 200:
                raise RuntimeError(f"PATCH /deployments/{name}: {r.status_code} {r.text[:300]}")
            await asyncio.sleep(0.5)
    # Until every change has its generation acked: at 1,000 hosts passes are paced (one begins no sooner than
    # twice the last one's CPU time after it), so the last changes are planned seconds after their PATCH.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        latencies, never = watch.push_to_ack(since=since)
        if len(latencies) >= count and not never:
            break
        await asyncio.sleep(0.5)
    if latencies:
        row["push -> ack, lone changes p50 / p99"] = (f"{1000 * percentile(latencies, 0.5):.0f} / "
                                                      f"{1000 * percentile(latencies, 0.99):.0f} ms ({len(latencies)}"
                                                      + (f", {never} not acked)" if never else ")"))


def falsely_offline(watch: HostWatch, fleet: SimFleet | ProcessFleet) -> int:
    """Hosts the console marked not connected at a moment their agent's link had been up for over a second."""
    hosts = set()
    for e in list(watch.events):
        agent = fleet.agents.get(e.host)
        if e.connected or agent is None:
            continue
        m = agent.metrics
        around_a_loss = any(lo - 1 <= e.at <= hi + 1 for lo, hi in m.offline)
        linked = m.connected_since is not None and m.connected_since < e.at - 1
        if linked and not around_a_loss:
            hosts.add(e.host)
    return len(hosts)


def run_one(args, hosts: int, replicas: int, tmp: Path) -> Run:
    run = Run(hosts, replicas, {"fleet": f"{hosts} x {args.gpus_per_host} GPUs", "replicas": f"{replicas:,}"})
    # Before anything starts and after it all stopped: how fast this machine ran Python (bench/harness.python_speed).
    run.row["Python calibration before / after"] = f"{python_speed():.1f}"
    data_dir = tmp / f"console-{hosts}"
    env = {"MODELGRID_STRATEGY": args.strategy}
    if args.profile:
        run.profile = tmp / f"profile-{hosts}.json"
        env |= profile_env(tmp, run.profile)
    up_args = ("--no-agent", "--scheduler-process") if args.scheduler_process else ("--no-agent",)
    run.row["console"] = "up, scheduler in a child" if args.scheduler_process else "up"
    run.row["simulator"] = f"{args.sim_processes} process" + ("es" if args.sim_processes > 1 else "")
    with running_stack(data_dir, gpus="sim:1x1GiB", args=up_args, **env) as stack:
        r = stack.api().post("/models", json={"name": "tiny", "path": str(write_model(tmp / "tiny"))})
        if r.status_code != 201:
            raise RuntimeError(f"POST /models: {r.status_code} {r.text}")
        say(f"registered tiny ({r.json().get('estimate_bytes', '?')} bytes estimated); issuing {hosts} agent tokens")
        tokens = issue_tokens(stack, hosts)
        watch = HostWatch(stack.env)
        watch.start()
        spec = SimSpec(gpus=args.gpus_per_host, gpu_bytes=int(args.gpu_gib * GIB),
                       report_interval=args.report_interval, load_s=args.load_s, seed=hosts, busy=args.busy)

        async def go() -> None:
            fleet = (ProcessFleet(stack.url, tokens, spec, args.connect_concurrency, args.sim_processes)
                     if args.sim_processes > 1 else SimFleet(stack.url, tokens, spec, args.connect_concurrency))
            async with fleet, collector_paused():
                await measure(stack, fleet, watch, args, run)

        try:
            run_loop(go())
        except Exception as e:  # a failed size still prints what it measured
            run.row["error"] = f"{type(e).__name__}: {e}"[:200]
            say(f"{hosts} hosts: {run.row['error']}")
            errors = [i for i, line in enumerate(stack.lines) if line.startswith("Traceback")]
            if errors:  # the console's side of it (its INFO lines interleave with the traceback)
                tail = [line for line in stack.lines[errors[-1]:] if " INFO " not in line]
                say("the console's last traceback:\n" + "".join(tail[:60]))
        finally:
            watch.stop()
            if args.console_log:
                Path(args.console_log).write_text("".join(stack.lines))
                say(f"the console's output: {args.console_log}")
    run.row["Python calibration before / after"] += f" / {python_speed():.1f} ms"
    for phase, samples in run.phases.items() if args.profile else ():
        print_profile(samples, f"Console profile, {hosts} hosts, {phase}")
    return run


def main() -> None:
    parser = command_line(__doc__, quick="20 hosts, 100 replicas, short waits")
    parser.add_argument("--hosts", type=int, nargs="+", default=[100], help="fleet sizes, one table row each")
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="memory of each simulated GPU")
    parser.add_argument("--replicas", type=int, help="replicas in all (default 10 per host)")
    parser.add_argument("--replicas-per-host", type=int, default=10)
    parser.add_argument("--replicas-per-deployment", type=int, default=1)
    parser.add_argument("--report-interval", type=float, default=2.0)
    parser.add_argument("--busy", action="store_true",
                        help="busy GPUs: every reading and serving figure moves, so every report is whole")
    parser.add_argument("--load-s", type=float, default=1.0, help="modelled load time of a replica")
    parser.add_argument("--strategy", default="balance",
                        help="MODELGRID_STRATEGY; balance spreads the tiny replicas over every host")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up waiting after this many seconds")
    parser.add_argument("--steady", type=float, default=30.0, help="seconds of steady CPU measurement")
    parser.add_argument("--connect-concurrency", type=int, default=50)
    parser.add_argument("--sim-processes", type=int, default=1, metavar="N",
                        help="run the simulated agents in N processes (bench/fleet_procs.py) instead of this one")
    parser.add_argument("--create-concurrency", type=int, default=4, help="POSTs in flight at once")
    parser.add_argument("--bulk", type=int, default=0, metavar="N",
                        help="create N deployments per POST /deployments/bulk (up to 1000) instead of one per POST")
    parser.add_argument("--lone-changes", type=int, default=20, metavar="N",
                        help="after the steady window, change N deployments one at a time and time their push -> ack")
    parser.add_argument("--sqlite", action="store_true", help="SQLite and the in-memory channel layer")
    parser.add_argument("--scheduler-process", action="store_true",
                        help="`up --scheduler-process`: the scheduler in a child process (its CPU counted with the "
                        "console's); not with --sqlite")
    parser.add_argument("--console-log", metavar="PATH", help="write the console's output here (the last size's)")
    parser.add_argument("--profile", action="store_true", help="sample the console's stacks and print the profile")
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.replicas, args.timeout, args.steady = [20], 100, 60.0, 10.0
    print_header()
    for name in ("hosts", "gpus_per_host", "replicas_per_host", "replicas_per_deployment", "connect_concurrency",
                 "create_concurrency", "sim_processes"):
        values = getattr(args, name)
        if any(v < 1 for v in (values if isinstance(values, list) else [values])):
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.bulk <= 1000:
        parser.error("--bulk must be 0 (one deployment per POST) to 1000")
    if args.sqlite and args.scheduler_process:
        parser.error("--scheduler-process needs the Redis channel layer: not with --sqlite")
    if args.sqlite:
        for name in ("DATABASE_URL", "REDIS_URL"):
            os.environ.pop(name, None)
    else:
        os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
        os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
    database = "SQLite, in-memory channel layer" if args.sqlite else "PostgreSQL, Redis channel layer"
    # A thousand simulated agents in this one process hold as many objects as the console: with CPython's collector
    # defaults its full collections stopped every agent at once (a real agent holds a host's few replicas).
    tune()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        for hosts in args.hosts:
            replicas = args.replicas or hosts * args.replicas_per_host
            if replicas % args.replicas_per_deployment:
                parser.error("--replicas must be a multiple of --replicas-per-deployment")
            run = run_one(args, hosts, replicas, Path(tmp))
            rows.append(run.row)
            print_table(f"Fleet: {hosts} simulated hosts ({database}; reports every {args.report_interval:g} s; "
                        f"load {args.load_s:g} s; strategy {args.strategy})", [run.row])
    if len(rows) > 1:
        print_table(f"Fleet, all sizes ({database})", rows)


if __name__ == "__main__":
    main()
