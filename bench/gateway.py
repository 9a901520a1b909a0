"""Gateway benchmarks: what the console's inference gateway costs and how it behaves when models share a GPU.
Each section starts its own `manage.py up` (free loopback port, temporary data dir, simulated GPUs), prints
tables, and stops it, always. All traffic stays on 127.0.0.1; no assertions on timings.

    .venv/bin/python bench/gateway.py                  # every section (several minutes)
    .venv/bin/python bench/gateway.py --quick          # a smoke run: few requests, short loads
    .venv/bin/python bench/gateway.py --sections overhead --pairs 1000 --throughput-seconds 20

Sections:
  overhead  the same small requests sent direct to the agent (with its gateway secret) and through the
            gateway, interleaved; then throughput at N concurrent keep-alive clients, direct vs gateway
  storm     three min-0 deployments of a tiny Llama on one GPU that holds one: clients send to all three
  ttfr      time to first response for a sleeping model (wake) and for a cold one (load from disk)
  accounting  what usage accounting and limits cost a request, in process (bench/gateway_accounting.py)
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import aiohttp  # noqa: E402
import httpx  # noqa: E402

from bench.gateway_accounting import section_accounting  # noqa: E402
from bench.harness import (  # noqa: E402
    command_line,
    deploy,
    deployment,
    gateway_secret,
    median,
    percentile,
    print_header,
    print_table,
    ready_replica,
    register,
    replica,
    running_stack,
    say,
    wait_until,
)

READY_TIMEOUT_S = 180.0
CLIENT_TIMEOUT_S = 120.0
PROMPT_IDS = [1, 5, 42, 7, 300, 2, 99, 11]  # input_ids shape [1, 8]
V2_BODY = {"inputs": [{"name": "input_ids", "shape": [1, len(PROMPT_IDS)], "datatype": "INT64", "data": PROMPT_IDS}]}
EMBED_TEXT = "a cat sat on the mat"


def metric_value(text: str, family: str, deployment_name: str) -> float | None:
    """A gauge's value for a deployment from Prometheus text (the first replica that has one)."""
    pattern = re.compile(rf'^{family}\{{[^}}]*deployment="{re.escape(deployment_name)}"[^}}]*\}} (\S+)$', re.M)
    m = pattern.search(text)
    return float(m.group(1)) if m else None


# -- section 1: overhead -------------------------------------------------------------------------------------


def section_overhead(args, models: dict[str, Path], tmp: Path) -> None:
    with running_stack(tmp / "overhead", gpus="sim:2x24GiB") as stack, stack.api() as api:
        register(api, "tiny", models["tiny-llama"])
        register(api, "minilm", models["minilm"])
        deploy(api, "llama", "tiny")
        deploy(api, "embed", "minilm")
        for name in ("llama", "embed"):
            wait_until(lambda n=name: ready_replica(api, n), READY_TIMEOUT_S, f"{name} to be ready", 0.2, stack)
        endpoint = ready_replica(api, "llama")["endpoint"].rstrip("/")
        assert ready_replica(api, "embed")["endpoint"].rstrip("/") == endpoint, "one agent expected"
        secret = gateway_secret(stack)
        console = stack.url.rstrip("/")
        kinds = {
            "v2 infer (tiny-llama, [1,8])": ("POST", "/v2/models/llama/infer", V2_BODY),
            "v1 embeddings (MiniLM, 1 string)": ("POST", "/v1/embeddings", {"model": "embed", "input": EMBED_TEXT}),
        }
        paths = {"direct": (endpoint, secret), "gateway": (console, stack.token)}

        # Sequential, interleaved: each pair sends one kind direct and through the gateway, the order
        # alternating from pair to pair, so drift and whatever one leaves behind weigh on both alike.
        lat: dict[tuple[str, str], list[float]] = {(k, p): [] for k in kinds for p in paths}
        failed: dict[tuple[str, str], int] = {key: 0 for key in lat}
        clients = {p: httpx.Client(base_url=base, headers={"Authorization": f"Bearer {tok}"}, timeout=30)
                   for p, (base, tok) in paths.items()}
        try:
            say(f"overhead: {args.warmup} warm-up and {args.pairs} measured pairs per kind, sequential")
            for i in range(args.warmup + args.pairs):
                for kind, (method, path, body) in kinds.items():
                    order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
                    for p in order:
                        began = time.perf_counter()
                        r = clients[p].request(method, path, json=body)
                        seconds = time.perf_counter() - began
                        ok = r.status_code == 200 and (p == "direct" or "x-modelgrid-replica" in r.headers)
                        if i < args.warmup:
                            if not ok:
                                raise RuntimeError(f"warm-up {p} {path}: {r.status_code} {r.text[:300]}")
                            continue
                        if ok:
                            lat[(kind, p)].append(seconds * 1e3)
                        else:
                            failed[(kind, p)] += 1
        finally:
            for c in clients.values():
                c.close()
        rows = []
        for (kind, p), values in lat.items():
            rows.append({"request": kind, "path": p, "n": len(values), "failed": failed[(kind, p)],
                         "p50 ms": percentile(values, 0.5), "p90 ms": percentile(values, 0.9),
                         "p99 ms": percentile(values, 0.99)})
        print_table("Overhead: sequential latency, direct to the agent vs through the gateway (interleaved)", rows)
        added = []
        for kind in kinds:
            d, g = lat[(kind, "direct")], lat[(kind, "gateway")]
            a50 = percentile(g, 0.5) - percentile(d, 0.5)
            a99 = percentile(g, 0.99) - percentile(d, 0.99)
            added.append({"request": kind, "added p50 ms": a50, "target p50": "<= 1", "meets p50": _ok(a50 <= 1),
                          "added p99 ms": a99, "target p99": "<= 5", "meets p99": _ok(a99 <= 5)})
        print_table("Overhead: added latency (gateway percentile minus direct percentile)", added,
                    notes=(f"This machine has {os.cpu_count()} CPU cores; the load generator, the console, the agent "
                           "and the workers all share them.",))

        # Throughput at N concurrent keep-alive clients, direct then gateway, per kind.
        rows = []
        for kind, (method, path, body) in kinds.items():
            rates = {}
            for p, (base, tok) in paths.items():
                say(f"throughput: {kind}, {p}, {args.concurrency} clients, {args.throughput_seconds:g} s")
                ok, bad, lats, elapsed = asyncio.run(
                    closed_loop(base + path, method, body, tok, args.concurrency, args.throughput_seconds))
                rates[p] = ok / elapsed
                rows.append({"request": kind, "path": p, "clients": args.concurrency, "seconds": elapsed,
                             "answered": ok, "failed": bad, "req/s": rates[p], "p50 ms": percentile(lats, 0.5),
                             "p99 ms": percentile(lats, 0.99)})
            ratio = rates["gateway"] / rates["direct"] if rates["direct"] else float("nan")
            rows[-1] |= {"gateway/direct": ratio, "target": ">= 0.80", "meets": _ok(ratio >= 0.8)}
        print_table(f"Overhead: throughput at {args.concurrency} concurrent keep-alive clients (aiohttp)", rows,
                    notes=(f"This machine has {os.cpu_count()} CPU cores; the load generator shares them with the "
                           "console, the agent and the workers, so these are figures for this box, not limits of "
                           "the gateway.",))


def _ok(flag: bool) -> str:
    return "yes" if flag else "NO"


async def closed_loop(url: str, method: str, body: dict, token: str, clients: int,
                      seconds: float) -> tuple[int, int, list[float], float]:
    """`clients` tasks each sending back to back on one pooled keep-alive session until `seconds` pass."""
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=30)
    ok = bad = 0
    lats: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout,
                                     headers=headers) as session:
        # Warm the pool: one request per connection.
        await asyncio.gather(*(_one(session, method, url, body) for _ in range(clients)))
        began = time.perf_counter()
        deadline = began + seconds

        async def client() -> None:
            nonlocal ok, bad
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                status = await _one(session, method, url, body)
                if status == 200:
                    ok += 1
                    lats.append((time.perf_counter() - t0) * 1e3)
                else:
                    bad += 1

        await asyncio.gather(*(client() for _ in range(clients)))
        return ok, bad, lats, time.perf_counter() - began


async def _one(session: aiohttp.ClientSession, method: str, url: str, body: dict) -> int:
    try:
        async with session.request(method, url, json=body) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


# -- section 2: swap storm -----------------------------------------------------------------------------------


def section_storm(args, models: dict[str, Path], tmp: Path) -> None:
    names = ["storm-a", "storm-b", "storm-c"]
    with running_stack(tmp / "storm", gpus="sim:1x3MiB") as stack, stack.api() as api:
        register(api, "tiny", models["tiny-llama"])
        for name in names:
            deploy(api, name, "tiny", min_replicas=0, max_replicas=1, priority="standard")
        first = wait_until(lambda: next((n for n in names if ready_replica(api, n)), None), READY_TIMEOUT_S,
                           "one storm deployment to be ready", 0.2, stack)
        say(f"storm: {first} ready; {args.storm_clients} clients for {args.storm_seconds:g} s")
        results = asyncio.run(storm(stack.url.rstrip("/"), stack.token, names, args.storm_clients,
                                    args.storm_seconds, args.seed))
        decisions = scheduler_decisions(stack.lines)
        rows, total_failed, reasons = [], 0, {}
        for name in [*names, "all"]:
            rs = [r for r in results if name in ("all", r["deployment"])]
            failed = [r for r in rs if r["status"] != 200]
            if name != "all":
                total_failed += len(failed)
                for r in failed:
                    why = f"{r['status']}: {r['error'][:200]}"
                    reasons[why] = reasons.get(why, 0) + 1
            queue = [r["queue_ms"] for r in rs if r["queue_ms"] is not None]
            lats = [r["ms"] for r in rs if r["status"] == 200]
            rows.append({"deployment": name, "requests": len(rs), "failed": len(failed),
                         "waits": sum(1 for q in queue if q > 0),
                         "queue p50 ms": percentile(queue, 0.5), "queue p95 ms": percentile(queue, 0.95),
                         "queue max ms": max(queue, default=float("nan")),
                         "latency p50 ms": percentile(lats, 0.5), "latency p95 ms": percentile(lats, 0.95),
                         "latency max ms": max(lats, default=float("nan")),
                         "put to sleep": sum(decisions[n]["sleep"] for n in names if name in ("all", n)),
                         "woken": sum(decisions[n]["wake"] for n in names if name in ("all", n))})
        notes = [f"Total failed: {total_failed} (target: 0; requests only queue)",
                 f"{args.storm_clients} clients, each picking a deployment at random per request (v1 completions, "
                 f"max_tokens 2), for {args.storm_seconds:g} s; one simulated GPU of 3 MiB holds one tiny Llama; "
                 f"latency is of the successful requests, queue-ms from x-modelgrid-queue-ms; 'put to sleep' and "
                 "'woken' count the scheduler's decisions in the log (modelgrid.scheduler: slept/woken "
                 "replica/NAME#i)."]
        if reasons:
            notes.append("Failures:\n" + "\n".join(f"- {n}x {why}" for why, n in
                                                     sorted(reasons.items(), key=lambda kv: -kv[1])))
        print_table("Swap storm: three min-0 deployments sharing a GPU that holds one", rows, tuple(notes))


async def storm(console: str, token: str, names: list[str], clients: int, seconds: float,
                seed: int) -> list[dict]:
    rng = random.Random(seed)
    results: list[dict] = []
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout,
                                     headers=headers) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                name = rng.choice(names)
                body = {"model": name, "prompt": "the cat", "max_tokens": 2, "temperature": 0}
                t0 = time.perf_counter()
                row = {"deployment": name, "status": 0, "queue_ms": None, "ms": 0.0, "error": ""}
                try:
                    async with session.post(console + "/v1/completions", json=body) as r:
                        text = await r.text()
                        row["status"] = r.status
                        q = r.headers.get("x-modelgrid-queue-ms")
                        row["queue_ms"] = float(q) if q is not None else None
                        if r.status != 200:
                            row["error"] = error_message(text)
                except (aiohttp.ClientError, TimeoutError) as e:
                    row["error"] = f"{type(e).__name__}: {e}"
                row["ms"] = (time.perf_counter() - t0) * 1e3
                results.append(row)

        await asyncio.gather(*(client() for _ in range(clients)))
    return results


def error_message(text: str) -> str:
    """The message of an OpenAI- or v2-shaped error body, else the text."""
    try:
        body = json.loads(text)
        err = body["error"]
        return str(err["message"] if isinstance(err, dict) else err)
    except (ValueError, KeyError, TypeError):
        return text.replace("\n", " ")


# The scheduler logs each action as its event's reason ("woken replica/NAME#0: ..."; console/control/reconcile.py).
ACTIONS = {"placed": "place", "moved": "move", "woken": "wake", "slept": "sleep", "preempted": "preempt",
           "stopped": "stop", "refused": "refuse"}


def scheduler_decisions(lines: list[str]) -> dict[str, dict[str, int]]:
    """Per deployment, how many times the scheduler's log says it decided each action (sleep, wake, ...)."""
    counts: dict[str, dict[str, int]] = {}
    for line in lines:
        m = re.search(r"modelgrid\.scheduler: (\w+) replica/(\S+)#\d+:", line)
        if m and m.group(1) in ACTIONS:
            per = counts.setdefault(m.group(2), {})
            action = ACTIONS[m.group(1)]
            per[action] = per.get(action, 0) + 1
    return collections.defaultdict(lambda: collections.defaultdict(int),
                                   {k: collections.defaultdict(int, v) for k, v in counts.items()})


# -- section 3: time to first response -----------------------------------------------------------------------


def timed_v2(gw: httpx.Client, name: str) -> tuple[float, float, httpx.Response]:
    began = time.perf_counter()
    r = gw.post(f"/v2/models/{name}/infer", json=V2_BODY)
    ms = (time.perf_counter() - began) * 1e3
    if r.status_code != 200:
        raise RuntimeError(f"{name}: {r.status_code} {r.text[:300]}")
    return ms, float(r.headers.get("x-modelgrid-queue-ms", "nan")), r


def warm_ms(gw: httpx.Client, name: str, n: int = 5) -> float:
    return median([timed_v2(gw, name)[0] for _ in range(n)])


def section_ttfr(args, models: dict[str, Path], tmp: Path) -> None:
    residency, grace = 5.0, 2.0  # the defaults, set explicitly so the waits below know them
    rows = []
    with running_stack(tmp / "ttfr-sleep", gpus="sim:1x3MiB", MODELGRID_MIN_RESIDENCY_SECONDS=str(residency),
                       MODELGRID_IDLE_GRACE_SECONDS=str(grace)) as stack, stack.api() as api, \
            stack.gateway() as gw:
        register(api, "tiny", models["tiny-llama"])
        for name in ("sleepy-a", "sleepy-b"):
            deploy(api, name, "tiny", min_replicas=0, max_replicas=1)
        timed_v2(gw, "sleepy-a")  # A loaded (cold the first time)
        for run in range(args.ttfr_runs):
            say(f"ttfr sleeping: run {run + 1}/{args.ttfr_runs}")
            for tries in range(1, 4):
                setups, setup_mark = tries, len(stack.lines)
                timed_v2(gw, "sleepy-b")  # B in, A put to sleep
                wait_until(lambda: a_asleep_b_ready(api), 60, "sleepy-a asleep and sleepy-b ready", 0.2, stack)
                # A warm request's latency, on B: the same model on the same GPU. (Measured on A, the extra traffic
                # would make the scheduler's temporal swap wake A on its own, as it favours the busier one.)
                warm = warm_ms(gw, "sleepy-b")
                time.sleep(residency + grace + 1)  # B past its minimum residency and idle
                if a_asleep_b_ready(api):  # still so (nothing woke A meanwhile)
                    break
                why = [line.rstrip() for line in stack.lines[setup_mark:] if "modelgrid.scheduler:" in line
                       and "refuse" not in line]
                say(f"sleepy-a was not asleep (or sleepy-b not ready) after the pause: {states(api)}; again. "
                    "The scheduler's decisions meanwhile:\n  " + "\n  ".join(why[-6:]))
            else:
                raise RuntimeError("could not get sleepy-a asleep with sleepy-b on the GPU in 3 tries")
            mark, sent = len(stack.lines), time.time()
            ms, queue_ms, r = timed_v2(gw, "sleepy-a")
            answered = time.time()
            wake = wait_until(lambda: _sleep_wake(api, "sleepy-a", "wake"), 30, "sleepy-a's wake figures", 0.2,
                              stack)
            slept = wait_until(lambda: _sleep_wake(api, "sleepy-b", "sleep"), 30, "sleepy-b's sleep figures", 0.2,
                               stack)
            wake_ms = wake["seconds"] * 1e3
            sleep_ms = slept["seconds"] * 1e3 if slept else 0.0
            steps = timeline(stack.lines[mark:], "sleepy-a", sent, answered)
            rows.append({"run": run + 1, "setups": setups, "TTFR ms": ms, "queue ms": queue_ms, **steps,
                         "B sleep ms": sleep_ms, "A wake ms": wake_ms, "warm ms": warm,
                         "overhead ms": ms - sleep_ms - wake_ms - warm})
    print_table("Time to first response, sleeping model (A asleep in host RAM, B on the one GPU)",
                _with_median(rows),
                notes=("overhead = TTFR - B's sleep - A's wake (both from the replicas' sleep_wake) - a warm "
                       "request's latency (median of 5 to B while B is in: the same model on the same GPU); "
                       "target: gateway + scheduler add <= 150 ms. The three middle columns split the TTFR by the "
                       "log's timestamps: the gateway's demand and "
                       "the scheduler's pass; the agent (B drained and put to sleep, then A woken); the status report "
                       "reaching the gateway, and the request itself.",
                       f"one simulated GPU of 3 MiB; MODELGRID_MIN_RESIDENCY_SECONDS={residency:g}, "
                       f"MODELGRID_IDLE_GRACE_SECONDS={grace:g}; each run waits {residency + grace + 1:g} s "
                       "after B is in, and checks A is still asleep ('setups': tries until it was)."))

    rows = []
    with running_stack(tmp / "ttfr-cold", gpus="sim:2x24GiB", args=("--sleep-budget", "0")) as stack, \
            stack.api() as api, stack.gateway() as gw:
        register(api, "tiny", models["tiny-llama"])
        deploy(api, "rare", "tiny", min_replicas=0, max_replicas=1, idle_timeout_s=2)
        secret = gateway_secret(stack)
        timed_v2(gw, "rare")
        for run in range(args.ttfr_runs):
            say(f"ttfr cold: run {run + 1}/{args.ttfr_runs}")
            before_pid = (replica(api, "rare") or {}).get("pid")
            wait_until(lambda: deployment(api, "rare")["serving"] == "cold", 60, "rare to go cold", 0.2, stack)
            wait_until(lambda: not any(r["pid"] for r in deployment(api, "rare")["replicas"]), 30,
                       "rare's worker to be gone", 0.2, stack)
            time.sleep(args.cold_pause)  # the agent's warm spare worker ready again
            mark, sent = len(stack.lines), time.time()
            ms, queue_ms, r = timed_v2(gw, "rare")
            answered = time.time()
            rep = wait_until(lambda: ready_replica(api, "rare"), 30, "rare ready in the API", 0.1, stack)
            endpoint = rep["endpoint"].rstrip("/")
            load_s = wait_until(lambda e=endpoint: _load_seconds(e, secret, "rare"), 30, "rare's load_seconds", 0.2,
                                stack)
            warm = warm_ms(gw, "rare")
            load_ms = load_s * 1e3
            steps = timeline(stack.lines[mark:], "rare", sent, answered)
            rows.append({"run": run + 1, "TTFR ms": ms, "queue ms": queue_ms, **steps, "load ms": load_ms,
                         "warm ms": warm,
                         "overhead ms": ms - load_ms - warm, "new pid": rep["pid"] != before_pid})
    print_table("Time to first response, cold model (scaled to zero, --sleep-budget 0, idle_timeout_s 2)",
                _with_median(rows),
                notes=("overhead = TTFR - the worker's load_seconds (the agent's modelgrid_replica_load_seconds on "
                       "its /metrics; the console API does not expose it) - a warm request's latency; it includes "
                       "the scheduler, the agent adopting a warm spare worker, the warm-up forward and the status "
                       "report, as well as the gateway; target: <= 150 ms. The middle columns split the TTFR by "
                       "the log's timestamps (scheduler's place decision; the agent's `replica N: ready`).",
                       f"each run waits for the deployment to report cold and its worker to exit, then "
                       f"{args.cold_pause:g} s for the agent's warm spare."))


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def timeline(lines: list[str], name: str, sent: float, answered: float) -> dict[str, float]:
    """The request's path from the log (same clock, ms resolution): send -> the scheduler's decision to wake or
    place `name` -> the agent's `replica N: ready` -> the response. NaN where a step is not in the log."""
    decided = ready = None
    for line in lines:
        m = LOG_TIME.match(line)
        if not m:
            continue
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        decision = rf"modelgrid\.scheduler: (woken|placed|moved) replica/{re.escape(name)}#"
        if decided is None and re.search(decision, line):
            decided = t
        elif decided is not None and ready is None and re.search(r"supervisor: replica \d+: ready$", line.rstrip()):
            ready = t
    nan = float("nan")
    return {"send->decision ms": (decided - sent) * 1e3 if decided else nan,
            "decision->agent ready ms": (ready - decided) * 1e3 if decided and ready else nan,
            "agent ready->response ms": (answered - ready) * 1e3 if ready else nan}


def states(api: httpx.Client) -> dict[str, str | None]:
    return {n: (replica(api, n) or {}).get("state") for n in ("sleepy-a", "sleepy-b")}


def a_asleep_b_ready(api: httpx.Client) -> bool:
    return states(api) == {"sleepy-a": "sleeping", "sleepy-b": "ready"}


def _sleep_wake(api: httpx.Client, name: str, direction: str) -> dict | None:
    sw = (replica(api, name) or {}).get("sleep_wake")
    return sw if sw and sw.get("direction") == direction else None


def _load_seconds(endpoint: str, secret: str, name: str) -> float | None:
    r = httpx.get(endpoint + "/metrics", headers={"Authorization": f"Bearer {secret}"}, timeout=10)
    if r.status_code != 200:
        return None
    return metric_value(r.text, "modelgrid_replica_load_seconds", name)


def _with_median(rows: list[dict]) -> list[dict]:
    if not rows:
        return rows
    med = {"run": "median"}
    for key in rows[0]:
        if key != "run" and all(isinstance(r[key], float) for r in rows):
            med[key] = median([r[key] for r in rows])
    return [*rows, med]


# -- running -------------------------------------------------------------------------------------------------

SECTIONS = {"overhead": section_overhead, "storm": section_storm, "ttfr": section_ttfr,
            "accounting": section_accounting}


def main() -> None:
    parser = command_line(__doc__, quick="a smoke run: few requests, short loads")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}")
    parser.add_argument("--pairs", type=int, help="measured direct/gateway pairs per kind (default 300; quick 30)")
    parser.add_argument("--warmup", type=int, help="warm-up pairs per kind (default 30; quick 5)")
    parser.add_argument("--concurrency", type=int, default=32, help="clients in the throughput runs")
    parser.add_argument("--throughput-seconds", type=float, help="each throughput run (default 10; quick 2)")
    parser.add_argument("--storm-seconds", type=float, help="the swap storm (default 60; quick 10)")
    parser.add_argument("--storm-clients", type=int, default=6)
    parser.add_argument("--ttfr-runs", type=int, help="runs of each time-to-first-response case (default 5; quick 2)")
    parser.add_argument("--cold-pause", type=float, default=3.0,
                        help="seconds after a replica went cold before the timed request (warm spare ready)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    unknown = [s for s in args.sections.split(",") if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; known: {', '.join(SECTIONS)}")
    q = args.quick
    args.pairs = args.pairs or (30 if q else 300)
    args.warmup = args.warmup if args.warmup is not None else (5 if q else 30)
    args.throughput_seconds = args.throughput_seconds or (2.0 if q else 10.0)
    args.storm_seconds = args.storm_seconds or (10.0 if q else 60.0)
    args.ttfr_runs = args.ttfr_runs or (2 if q else 5)

    from agent.workers.demo_models import build_tiny_llama, copy_minilm

    print_header("simulated GPUs, CPU workers; all traffic on 127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp_name:
        tmp = Path(tmp_name)
        served = set(args.sections.split(",")) - {"accounting"}  # sections that start a stack and serve models
        models = {"tiny-llama": build_tiny_llama(tmp / "models" / "tiny-llama"),
                  "minilm": copy_minilm(tmp / "models" / "minilm")} if served else {}
        for name in args.sections.split(","):
            began = time.monotonic()
            load = os.getloadavg()[0]
            SECTIONS[name](args, models, tmp)
            print(f"\n(section {name}: {time.monotonic() - began:.0f} s; 1-minute load average {load:.2f} before, "
                  f"{os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
