"""The `accounting` section of bench/gateway.py: what usage accounting and limits cost a request at the gateway.

In process, the gateway's own code (console/gateway/usage.py, reservation.py, limits.py, Gateway.admitted and
Gateway.account), timed per request: a non-streamed chat answer, and a streamed one of 64 tokens (its body
re-encoded to ask for usage, every event passed through the meter, the usage chunk taken out). The limits are all set
(the token's RPM and TPM, the team's RPM, TPM and quota) and never reached, so every check runs, and each request's
tokens are reserved at admission (what it may use, from its body) and settled at its end. Then the background share:
writing a flush's tallies and syncing the limit counters (a tenth of the requests still in flight, their
reservations shared), per request, on SQLite and (when it answers) PostgreSQL; that runs in a worker thread, off the
event loop, but on the console's CPU."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from bench.harness import median, print_table, say

PG_URL = "postgres://postgres@127.0.0.1:5432/postgres"
REQUEST = {"model": "chat", "messages": [{"role": "user", "content": "Say hello to the team in one sentence."}],
           "max_tokens": 64, "temperature": 0.7}
ANSWER = json.dumps({
    "id": "chatcmpl-1234567890", "object": "chat.completion", "created": 1_800_000_000, "model": "chat",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello team! " * 20},
                 "finish_reason": "length", "logprobs": None}],
    "usage": {"prompt_tokens": 17, "completion_tokens": 64, "total_tokens": 81}}).encode()


def _chunk(i: int) -> bytes:
    return b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_800_000_000,
                                   "model": "chat", "choices": [{"index": 0, "delta": {"content": f" w{i}"},
                                                                 "finish_reason": None}]}).encode() + b"\n\n"


STREAM = [_chunk(i) for i in range(64)] + [
    b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_800_000_000,
                            "model": "chat", "choices": [],
                            "usage": {"prompt_tokens": 17, "completion_tokens": 64, "total_tokens": 81}}).encode()
    + b"\n\n", b"data: [DONE]\n\n"]


def _per_call_us(work, n: int, repeats: int) -> float:
    """Median over `repeats` runs of `n` calls: microseconds per call."""
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(n):
            work()
        runs.append(1e6 * (time.perf_counter() - began) / n)
    return median(runs)


def _request_paths(repeats: int) -> list[dict]:
    from console.gateway.auth import Caller
    from console.gateway.core import Gateway, GatewaySettings
    from console.gateway.fleet import DeploymentView
    from console.gateway.limits import TeamLimits
    from console.gateway.metrics import ConsoleMetrics
    from console.gateway.reservation import need
    from console.gateway.usage import Meter, ask_for_usage

    big = 10**12  # limits set, never reached: every check runs, none refuses
    dep = DeploymentView("chat", "standard", 2, "generate", "ready", (), (), team=7, context=4096)
    body = json.dumps(REQUEST).encode()

    def gateway(limited: bool) -> tuple[Gateway, Caller]:
        gw = Gateway(GatewaySettings(), ConsoleMetrics())
        if limited:
            gw.limiter.teams = {7: TeamLimits("ml", big, big, big, "month")}
        caller = Caller("k" * 16, "ann", "all", label="bot (mg_abc…)", token_id=3,
                        rpm_limit=big if limited else None, tpm_limit=big if limited else None)
        return gw, caller

    def plain(gw: Gateway, caller: Caller):
        def once() -> None:
            meter = Meter()
            with gw.admitted(caller, dep, need=need("/v1/chat/completions", REQUEST, len(body), dep.context)) as hold:
                meter.read(ANSWER)
            gw.account(dep.name, dep.team, caller, 200, 0.0, meter.prompt, meter.completion, hold)
        return once

    def streamed(gw: Gateway, caller: Caller):
        def once() -> None:
            meter = Meter()
            parsed = dict(REQUEST, stream=True)
            meter.strip = ask_for_usage(parsed)
            json.dumps(parsed).encode()
            with gw.admitted(caller, dep, need=need("/v1/chat/completions", parsed, len(body), dep.context)) as hold:
                for chunk in STREAM:
                    meter.events(chunk)
                meter.events(b"", last=True)
            gw.account(dep.name, dep.team, caller, 200, 0.0, meter.prompt, meter.completion, hold)
        return once

    def concurrency_only(gw: Gateway, caller: Caller):  # admission alone: concurrency, the limits, the reservation
        def once() -> None:
            with gw.admitted(caller, dep, need=need("/v1/chat/completions", REQUEST, len(body), dep.context)) as hold:
                pass
            gw.limiter.settle(hold, 81)
        return once

    rows = []
    for name, make, n in (("admission (concurrency, limits, reservation), none set", concurrency_only, 20_000),
                          ("admission (concurrency, limits, reservation), all set", concurrency_only, 20_000),
                          ("chat answer: limits, usage read, accounted", plain, 20_000),
                          ("streamed chat, 64 tokens: the same, per stream", streamed, 2_000)):
        limited = not name.endswith("none set")
        gw, caller = gateway(limited)
        us = _per_call_us(make(gw, caller), n, repeats)
        rows.append({"request path": name, "limits": "all set" if limited else "none", "calls": n * repeats,
                     "us per request": round(us, 2), "target us": 200, "meets": "yes" if us < 200 else "NO"})
    return rows


def _background(database: str, requests: int, repeats: int) -> dict:
    """One flush of `requests` requests' tallies (10 tokens x 5 deployments x 2 teams) and one limiter sync."""
    import asyncio

    from django.contrib.auth import get_user_model

    from console.accounts.models import ApiToken, Team
    from console.gateway.limits import Limiter
    from console.gateway.reservation import Need
    from console.gateway.usage import Tally
    from console.usage import store

    user = get_user_model().objects.create_user(f"bench-{os.getpid()}-{time.monotonic_ns()}")
    teams = [Team.objects.create(name=f"bench-{time.monotonic_ns()}-{i}", rpm_limit=10**9, tpm_limit=2 * 10**9,
                                 token_quota=10**15) for i in range(2)]
    tokens = [ApiToken.issue(user, f"bench-{i}")[0].pk for i in range(10)]
    flush, sync = [], []  # (wall ms, this process's CPU ms) of each
    limiter = Limiter()
    for _ in range(repeats):
        tally = Tally()
        for i in range(requests):
            team = teams[i % 2].pk
            tally.add(f"dep-{i % 5}", team, tokens[i % 10], 200, 0.0, 17, 64)
            hold = limiter.admit(tokens[i % 10], "bench", 10**9, 10**12, team, need=Need(150, 86, 64, 1))
            if i % 10:  # the rest still in flight at the sync: their reservations shared
                limiter.settle(hold, 81)
        rows = tally.drain()
        flush.append(_timed(lambda: store.write(rows)))  # noqa: B023
        sync.append(_timed(lambda: asyncio.run(limiter.sync())))
    cpu = median([c for _, c in flush]) + median([c for _, c in sync])
    return {"database": database, "requests per flush": requests, "tally keys": len(rows),
            "usage write ms": round(median([w for w, _ in flush]), 2),
            "limits sync ms": round(median([w for w, _ in sync]), 2), "console CPU ms": round(cpu, 2),
            "CPU us per request": round(1000 * cpu / requests, 2)}


def _timed(work) -> tuple[float, float]:
    """Wall milliseconds, and this process's CPU milliseconds in all its threads (the database's own are not)."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return 1000 * (time.perf_counter() - wall), 1000 * (time.process_time() - cpu)


def _pg_answers() -> bool:
    with contextlib.suppress(Exception):
        import psycopg

        psycopg.connect(PG_URL, connect_timeout=2).close()
        return True
    return False


def section_accounting(args, models, tmp: Path) -> None:
    from bench.pass_cost import drop_database, setup_django

    repeats = 3 if args.quick else 7
    pg = _pg_answers()
    with tempfile.TemporaryDirectory(prefix="bench-accounting-") as scratch:
        created = setup_django(Path(scratch), PG_URL if pg else None)
        try:
            say("request path (in process)")
            print_table("Accounting and limits: the gateway's CPU per request (in process, median of "
                        f"{repeats} runs)", _request_paths(repeats))
            sizes = (50, 500) if args.quick else (50, 500, 5000)
            rows = [_background("PostgreSQL" if pg else "SQLite", n, repeats) for n in sizes]
            print_table("Accounting and limits: one flush and one limit sync (every 0.5 s; a worker thread, off "
                        "the event loop), and their share per request", rows,
                        ("requests per flush: a console process taking 100, 1,000 or 10,000 requests/s flushes 50, "
                         "500 or 5,000 requests' tallies each time",))
        finally:
            if created:
                drop_database(PG_URL, created)
