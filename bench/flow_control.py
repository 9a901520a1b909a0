"""The gateway's flow control through a console: fairness between API tokens, overload by criticality band, and
waking a sleeping replica against queueing on a ready one.

    .venv/bin/python bench/flow_control.py --fairness    # key B's TTFT alone and beside key A's flood
    .venv/bin/python bench/flow_control.py --overload    # 2x capacity, a third each critical/standard/sheddable
    .venv/bin/python bench/flow_control.py --wake        # a burst on one ready replica with one asleep
    .venv/bin/python bench/flow_control.py --quick       # small versions of all three, a smoke run

Each section starts `manage.py up` (simulated GPUs, CPU workers of one torch thread each) serving one deployment
"chat" of a seeded random-weight ~23M-parameter Llama on the built-in engine (bench/prefix_routing.py's model), with
two inference API tokens of one user, key A and key B: two flows of one team. Requests are streamed completions of
short prompts with ignore_eos (each makes exactly its --new-tokens); TTFT is the time to the first token's event.
MODELGRID_GATEWAY_REPLICA_SLOTS is set small, so that the gateway's queue, not the replica's batch, holds the
backlog: each replica's declared batch and max_batch_size equal its slots.

--fairness: key B alone (2 closed-loop clients), then again while key A keeps --flood requests in flight.
--overload: capacity first (closed loop at twice the slots), an SLO of twice the service time at saturation (or
--slo-ms), then Poisson arrivals at --overload-factor x capacity for --seconds, bands in turn.
--wake: two GPUs that hold one replica each; "chat" (standard, 2 replicas, min 0) fills both, then "other"
(critical, 1 replica, never called) takes one for its minimum, which puts chat's extra replica to sleep in host RAM;
then "other" becomes standard with min_replicas 0. A burst on chat should then wake the sleeping replica (the gateway
writes demand; the scheduler lifts it, putting idle "other" to sleep) while early requests go to the ready one.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import aiohttp  # noqa: E402

from bench.flow_load import (  # noqa: E402
    arrivals,
    closed_loop,
    fairness_row,
    open_loop,
    overload_rows,
    prompts,
    request,
    session,
    timeline_rows,
)
from bench.harness import (  # noqa: E402
    command_line,
    deploy,
    deployment,
    percentile,
    print_header,
    print_table,
    register,
    running_stack,
    say,
    wait_until,
)
from tests.e2e.stack import Stack  # noqa: E402

READY_TIMEOUT_S = 300.0
SEQ = 256  # each replica's declared tokens per sequence: short prompts and --new-tokens fit


@contextmanager
def flow_stack(tmp: Path, name: str, gpus: str, **env: str) -> Iterator[tuple[Stack, dict[str, str]]]:
    """A running stack with the decoder registered, and two inference tokens of its user: {"A": .., "B": ..}."""
    from bench.generation_stack import up_args

    _, up = up_args("cpu")
    with running_stack(tmp / name, gpus=gpus, args=up, **env) as stack:
        keys = {k: stack.manage("createapitoken", "e2e", "--name", f"key-{k.lower()}", "--scope", "inference")
                for k in ("A", "B")}
        with stack.api() as api:
            register(api, "decoder", tmp / "models" / "decoder")
        yield stack, keys


def states(stack: Stack, name: str = "chat") -> dict[int, str]:
    with stack.api() as api:
        return {r["index"]: r["state"] for r in deployment(api, name)["replicas"]}


def serve_chat(stack: Stack, slots: int, ready: int = 1, **fields) -> None:
    """Deploy "chat" with a batch of `slots` and wait until `ready` replicas are ready."""
    with stack.api() as api:
        deploy(api, "chat", "decoder", batch=slots, seq=SEQ, max_batch_size=slots, **fields)
    wait_until(lambda: sum(s == "ready" for s in states(stack).values()) >= ready, READY_TIMEOUT_S,
               f"{ready} ready replica(s) of chat", 0.5, stack)


def warm(url: str, key: str, args) -> None:
    async def go():
        async with session(key) as http:
            await closed_loop(http, url, "warm", prompts(4, args.words, args.seed + 99), 2, args.new_tokens,
                              time.perf_counter())
    asyncio.run(go())


def env_of(slots: int, wait_s: float, **more: str) -> dict[str, str]:
    return {"MODELGRID_GATEWAY_REPLICA_SLOTS": str(slots), "MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS": f"{wait_s:g}"} | more


# -- fairness ------------------------------------------------------------------------------------------------


async def _fairness_runs(url: str, keys: dict[str, str], args) -> tuple[list, list, list, tuple[float, float]]:
    # B's second run has prompts of its own: the replica's prefix cache would serve the first run's again.
    b_texts, b_again = (prompts(args.b_requests, args.words, args.seed + i) for i in (1, 11))
    a_texts = prompts(256, args.words, args.seed + 2)
    origin = time.perf_counter()
    async with session(keys["B"]) as b_http:
        alone = await closed_loop(b_http, url, "B", b_texts, 2, args.new_tokens, origin)
    stop = asyncio.Event()
    async with session(keys["A"]) as a_http, session(keys["B"]) as b_http:
        flood = asyncio.create_task(closed_loop(a_http, url, "A", a_texts, args.flood, args.new_tokens, origin,
                                                until=stop.is_set))
        await asyncio.sleep(args.flood_lead)  # the flood fills the slots and the queue before B comes back
        began = time.perf_counter() - origin
        flooded = await closed_loop(b_http, url, "B", b_again, 2, args.new_tokens, origin)
        window = (began, time.perf_counter() - origin)
        stop.set()
        a = await flood
    return alone, flooded, a, window


def section_fairness(args, tmp: Path) -> None:
    env = env_of(args.slots, args.queue_wait)
    with flow_stack(tmp, "fairness", "sim:2x24GiB", **env) as (stack, keys):
        serve_chat(stack, args.slots)
        warm(stack.url, keys["B"], args)
        say(f"fairness: key B alone, then beside key A's {args.flood} in flight")
        alone, flooded, a, window = asyncio.run(_fairness_runs(stack.url, keys, args))
    rows = [fairness_row("B alone", alone, [], None), fairness_row(f"B with A's flood of {args.flood}", flooded, a,
                                                                    window)]
    ratio = rows[1]["B TTFT p90 s"] / rows[0]["B TTFT p90 s"]
    service = percentile([r.total - r.queue_ms / 1e3 for r in a if r.kind == "served" and not math.isnan(r.queue_ms)],
                         0.5)
    print_table(f"Fairness: key B (2 closed-loop clients, {args.b_requests} requests) alone and beside key A "
                f"({args.flood} in flight), one replica, MODELGRID_GATEWAY_REPLICA_SLOTS={args.slots}", rows,
                notes=(f"B's TTFT p90 with the flood / alone: {ratio:.2f}x (target: at most 2x); p50 "
                       f"{rows[1]['B TTFT p50 s'] / rows[0]['B TTFT p50 s']:.2f}x.",
                       f"{args.words}-token prompts, {args.new_tokens} new tokens (ignore_eos), streamed; A's req/s "
                       "counts A's requests that ended while B ran; errors must be 0 (A's own-limit 429: refusals "
                       "for its token's requests in flight, counted apart); the flood began "
                       f"{args.flood_lead:g} s before B's second run.",
                       f"While B is active, A holds at most its share of the replica's {args.slots} slots (half), so "
                       "B's next request finds one free; A alone uses all of them. A request holds its slot for its "
                       f"whole service time (A's p50, latency less queue: {service:.3f} s). Queue wait limit "
                       f"{args.queue_wait:g} s; random weights, CPU, 1 torch thread per worker."))


# -- overload ------------------------------------------------------------------------------------------------


async def _capacity(url: str, key: str, args) -> tuple[list, float]:
    texts = prompts(128, args.words, args.seed + 3)
    origin = time.perf_counter()
    async with session(key) as http:
        records = await closed_loop(http, url, "A", texts, 2 * args.slots, args.new_tokens, origin,
                                    until=lambda: time.perf_counter() - origin >= args.capacity_seconds)
    return records, time.perf_counter() - origin


async def _overload(url: str, key: str, rate: float, args) -> list:
    texts = prompts(256, args.words, args.seed + 4)
    async with session(key) as http:
        return await open_loop(http, url, "A", texts, arrivals(rate, args.seconds, args.seed), args.new_tokens,
                               time.perf_counter())


def section_overload(args, tmp: Path) -> None:
    # The token's and deployment's own caps (and the no-replica queue's) raised: flow control answers the overload.
    big = str(1 << 14)
    env = env_of(args.slots, args.queue_wait, MODELGRID_GATEWAY_TOKEN_CONCURRENCY=big,
                 MODELGRID_GATEWAY_DEPLOYMENT_CONCURRENCY=big, MODELGRID_GATEWAY_QUEUE_MAX=big)
    with flow_stack(tmp, "overload", "sim:2x24GiB", **env) as (stack, keys):
        serve_chat(stack, args.slots)
        warm(stack.url, keys["A"], args)
        say(f"overload: capacity, {2 * args.slots} closed-loop clients for {args.capacity_seconds:g} s")
        records, wall = asyncio.run(_capacity(stack.url, keys["A"], args))
        served = [r for r in records if r.kind == "served"]
        capacity = len(served) / wall
        service = percentile([r.total - r.queue_ms / 1e3 if not math.isnan(r.queue_ms) else r.total
                              for r in served], 0.5)
        slo_ms = args.slo_ms or max(50, 10 * math.ceil(200 * service))  # twice the service time, in 10 ms steps
        with stack.api() as api:
            r = api.patch("/deployments/chat", json={"slo_latency_ms": slo_ms})
            assert r.status_code == 200, r.text
        time.sleep(args.settle)  # the gateway's view of the deployment takes the SLO
        rate = args.overload_factor * capacity
        say(f"overload: {capacity:.2f} req/s capacity, SLO {slo_ms} ms; {rate:.2f} req/s for {args.seconds:g} s")
        results = asyncio.run(_overload(stack.url, keys["A"], rate, args))
    rows = overload_rows(results, slo_ms)
    served_wait, refused_after = (max((r[c] for r in rows if not math.isnan(r[c])), default=float("nan"))
                                  for c in ("longest served wait s", "longest 503 s"))
    critical = next((r for r in rows if r["band"] == "critical"), {})
    # What the replica managed while the arrivals ran: capacity measured before can differ on a shared machine.
    during = sum(r.kind == "served" and r.ended <= args.seconds for r in results) / args.seconds
    refused_words = "(none)" if math.isnan(refused_after) else f"{refused_after:.2f} s"
    print_table(f"Overload: Poisson arrivals at {args.overload_factor:g}x capacity ({rate:.2f} req/s) for "
                f"{args.seconds:g} s, a third each critical/standard/sheddable (header), one replica, "
                f"MODELGRID_GATEWAY_REPLICA_SLOTS={args.slots}, slo_latency_ms {slo_ms}", rows,
                notes=(f"Capacity: {capacity:.2f} req/s served by {2 * args.slots} closed-loop clients over "
                       f"{wall:.1f} s ({len(records) - len(served)} not served); service time p50 {service:.3f} s "
                       f"(latency less queue); SLO {'given' if args.slo_ms else 'twice that'}. Served while the "
                       f"arrivals ran: {during:.2f} req/s (critical arrived at {rate / 3:.2f} req/s).",
                       f"Critical served within the SLO: {critical.get('served within SLO', '-')} (target: 95% or "
                       f"more; within: TTFT at most slo_latency_ms). Longest wait of a served request "
                       f"{served_wait:.2f} s (its x-modelgrid-queue-ms), longest time to a 503 "
                       f"{refused_words} (the client's "
                       f"clock), against the queue wait limit {args.queue_wait:g} s: "
                       f"{'within' if not served_wait > args.queue_wait else 'OVER'}.",
                       f"{args.words}-token prompts, {args.new_tokens} new tokens (ignore_eos), streamed, one token; "
                       "its concurrency, the deployment's and the no-replica queue's caps raised to "
                       f"{big}. Random weights, CPU, 1 torch thread per worker."))


# -- wake versus queue ---------------------------------------------------------------------------------------


async def _watch(stack: Stack, origin: float, seen: list[tuple[float, str, str]], stop: asyncio.Event) -> None:
    """Record each change of chat's replicas' states and of its demand, seconds after `origin`."""
    last: dict[str, str] = {}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {stack.token}"}) as http:
        while not stop.is_set():
            async with http.get(stack.url + "api/v1/deployments/chat") as r:
                now, dep = time.perf_counter() - origin, await r.json()
            facts = {f"#{rep['index']}": rep["state"] for rep in dep["replicas"]}
            facts["demand"] = f"{dep['demand']} {dep['demand_status']}".strip()
            for what, value in facts.items():
                if last.get(what) != value:
                    last[what] = value
                    seen.append((now, what, value))
            await asyncio.sleep(0.2)


def _asks(stack: Stack) -> str:
    """The gateway's count of asks for another replica of chat (its /metrics), as text."""
    with stack.gateway() as gw:
        text = gw.get("/metrics").text
    found = [line.rsplit(" ", 1)[1] for line in text.splitlines()
             if line.startswith("modelgrid_gateway_replica_asks_total") and 'deployment="chat"' in line]
    return found[0] if found else "0 (no series)"


def _woken(seen: list[tuple[float, str, str]], before: dict[int, str]) -> float | None:
    """When a replica that slept before the burst was first seen ready (seconds after the burst), else None."""
    asleep = {f"#{i}" for i, state in before.items() if state == "sleeping"}
    return next((t for t, what, value in seen if value == "ready" and what in asleep), None)


async def _bursts(stack: Stack, key: str, before: dict[int, str], args) -> tuple[list, list]:
    texts = prompts(2 * args.burst, args.words, args.seed + 5)
    seen: list[tuple[float, str, str]] = []
    stop = asyncio.Event()
    origin = time.perf_counter()
    watcher = asyncio.create_task(_watch(stack, origin, seen, stop))
    records = []
    async with session(key) as http:
        for wave in range(2):
            batch = texts[wave * args.burst:(wave + 1) * args.burst]
            records += await asyncio.gather(*(request(http, stack.url, f"burst {wave + 1}", t, args.new_tokens,
                                                      origin) for t in batch))
            # The second burst once the sleeping replica is up (or --wake-wait passed): it meets both.
            deadline = time.perf_counter() + args.wake_wait
            while wave == 0 and _woken(seen, before) is None and time.perf_counter() < deadline:
                await asyncio.sleep(0.1)
    stop.set()
    await watcher
    return records, seen


def section_wake(args, tmp: Path) -> None:
    env = env_of(args.wake_slots, args.queue_wait)
    with flow_stack(tmp, "wake", f"sim:2x{args.gpu_mib}MiB", **env) as (stack, keys):
        # min_replicas 0: both of chat's replicas are extras, so whichever one "other" puts to sleep stays asleep (a
        # sleeping minimum would take its GPU back from "other" at once).
        serve_chat(stack, args.wake_slots, ready=2, replicas=2, min_replicas=0, max_replicas=2)
        with stack.api() as api:
            # Critical, "other" takes a GPU from chat's extra replica, which goes to sleep in host RAM. Then standard
            # and above its minimum (0): it keeps the GPU from a chat without traffic (a batch one would not: chat's
            # extra replica outranks it), yet a backlog's demand may take it once it is idle.
            deploy(api, "other", "decoder", batch=args.wake_slots, seq=SEQ, max_batch_size=args.wake_slots,
                    priority="critical")
            wait_until(lambda: sorted(states(stack).values()) == ["ready", "sleeping"]
                       and states(stack, "other") == {0: "ready"}, READY_TIMEOUT_S,
                       "chat: one replica ready, one asleep; other ready", 0.5, stack)
            r = api.patch("/deployments/other", json={"priority": "standard", "min_replicas": 0, "max_replicas": 1})
            assert r.status_code == 200, r.text
        # No warm-up: chat's traffic would have the scheduler swap other out for it before the burst.
        say(f"wake: chat {states(stack)}, other standard, min 0; {args.idle:g} s of scheduler passes, then the burst")
        time.sleep(args.idle)
        if sorted(states(stack).values()) != ["ready", "sleeping"] or states(stack, "other") != {0: "ready"}:
            with stack.api() as api:
                why = [f"{n}#{r['index']} {r['state']}: {r['reason']}" for n in ("chat", "other")
                       for r in deployment(api, n)["replicas"]]
            raise RuntimeError("the layout did not hold: " + "; ".join(why))
        before = states(stack)
        with stack.api() as api:
            figures = {r["index"]: r["sleep_wake"] for r in deployment(api, "chat")["replicas"]}
        records, seen = asyncio.run(_bursts(stack, keys["A"], before, args))
        with stack.api() as api:
            after = deployment(api, "chat")
            other = deployment(api, "other")
        asks = _asks(stack)
    woke = _woken(seen, before)
    print_table(f"Wake versus queue: two bursts of {args.burst} concurrent requests (the second once the sleeping "
                f"replica is ready, or {args.wake_wait:g} s after the first ended), chat with one replica ready and "
                f"one asleep, MODELGRID_GATEWAY_REPLICA_SLOTS={args.wake_slots}", timeline_rows(records),
                notes=(f"Replicas before the burst: {before}; the sleeping one ready at "
                       + (f"t = {woke:.2f} s" if woke is not None else "no time within the bursts") + ".",
                       f"Their sleep_wake figures before it: {figures}; the gateway's asks for another replica "
                       f"(modelgrid_gateway_replica_asks_total): {asks}.",
                       "Changes seen (t s, replica or demand, value): "
                       + "; ".join(f"{t:.2f} {what} {value}" for t, what, value in seen) + ".",
                       f"After: chat demand {after['demand']}, demand_status {after['demand_status']!r}, reason "
                       f"{after['demand_reason']!r}; replicas "
                       + "; ".join(f"#{r['index']} {r['state']}: {r['reason']}" for r in after["replicas"]) + ".",
                       "other: " + "; ".join(f"#{r['index']} {r['state']}: {r['reason']}"
                                              for r in other["replicas"]) + ".",
                       f"Two simulated GPUs of {args.gpu_mib} MiB, each holding one replica; {args.words}-token "
                       f"prompts, {args.new_tokens} new tokens. Random weights, CPU, 1 torch thread per worker."))


# -- the command line ----------------------------------------------------------------------------------------


def arguments(argv: list[str] | None = None):
    """The parsed command line, --quick's smaller defaults filled in."""
    parser = command_line(__doc__, quick="small versions of all three sections, a smoke run")
    parser.add_argument("--fairness", action="store_true", help="only fairness between two tokens")
    parser.add_argument("--overload", action="store_true", help="only overload by band")
    parser.add_argument("--wake", action="store_true", help="only wake versus queue")
    parser.add_argument("--slots", type=int, default=4, help="MODELGRID_GATEWAY_REPLICA_SLOTS (fairness, overload)")
    parser.add_argument("--wake-slots", type=int, default=2, help="MODELGRID_GATEWAY_REPLICA_SLOTS (wake)")
    parser.add_argument("--queue-wait", type=float, default=30.0, help="MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS")
    parser.add_argument("--words", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--b-requests", type=int, help="key B's requests per run (default 40; quick 10)")
    parser.add_argument("--flood", type=int, default=48, help="key A's requests in flight")
    parser.add_argument("--flood-lead", type=float, default=3.0, help="seconds the flood runs before B's run")
    parser.add_argument("--capacity-seconds", type=float, help="the capacity run (default 20; quick 6)")
    parser.add_argument("--seconds", type=float, help="the overload's arrivals (default 60; quick 10)")
    parser.add_argument("--overload-factor", type=float, default=2.0, help="arrival rate / capacity")
    parser.add_argument("--slo-ms", type=int, help="the deployment's slo_latency_ms (default: 2x service time)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds for the gateway to see the new SLO")
    parser.add_argument("--burst", type=int, help="requests per wake burst (default 24; quick 12)")
    parser.add_argument("--gpu-mib", type=int, default=200, help="each simulated GPU (wake): one replica, not two")
    parser.add_argument("--wake-wait", type=float, help="most seconds between the wake bursts (default 20; quick 10)")
    parser.add_argument("--idle", type=float, default=12.0,
                        help="seconds of scheduler passes before the wake burst (past other's minimum residency)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    q = args.quick
    args.b_requests = args.b_requests or (10 if q else 40)
    args.capacity_seconds = args.capacity_seconds or (6.0 if q else 20.0)
    args.seconds = args.seconds or (10.0 if q else 60.0)
    args.burst = args.burst or (12 if q else 24)
    args.wake_wait = args.wake_wait or (10.0 if q else 20.0)
    if q and args.flood == 48:
        args.flood = 16
    return args


def main() -> None:
    args = arguments()
    from bench.generation_models import build_decoder
    from bench.prefix_cache import SHAPE

    every = not (args.fairness or args.overload or args.wake)
    with tempfile.TemporaryDirectory(prefix="bench-flow-control-") as name:
        tmp = Path(name)
        params = build_decoder(tmp / "models" / "decoder", SHAPE)
        print_header("through `manage.py up` with simulated GPUs and CPU workers (built-in torch engine)",
                     f"model: seeded random-weight Llama, {params / 1e6:.1f}M parameters ({SHAPE.layers} layers, "
                     f"hidden {SHAPE.hidden}), float32")
        if args.fairness or every:
            section_fairness(args, tmp)
        if args.overload or every:
            section_overload(args, tmp)
        if args.wake or every:
            section_wake(args, tmp)


if __name__ == "__main__":
    main()
