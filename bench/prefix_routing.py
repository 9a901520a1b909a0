"""Prefix-aware routing in the gateway: what a routing decision costs, and what it saves on a shared-prefix workload.

    .venv/bin/python bench/prefix_routing.py --cost              # decision time per request, in process
    .venv/bin/python bench/prefix_routing.py --workload          # TTFT and throughput, routing on vs off
    .venv/bin/python bench/prefix_routing.py --workload --engine vllm   # on vLLM's CPU build (make vllm), 3.5-5 min
    .venv/bin/python bench/prefix_routing.py --quick             # both, a smoke run

--cost times what the gateway adds per request on its event loop (console/gateway/prefix_index.py and
routing.predicted_choice): the prompt's text cut to its bounded prefix, the chain hashes of its blocks, the index's
lookup over the replicas, the choice and the index's update, for completion and chat bodies of 1 KB, 16 KB and 1 MB,
against an index warmed with many prefixes. The body's JSON parse is not counted: the gateway parses every OpenAI
body already (for its model name), off the loop above 256 KiB.

--workload starts `manage.py up` twice (simulated GPUs, CPU workers of one torch thread each), once with
MODELGRID_GATEWAY_PREFIX_ROUTING=0 and once with it on, each time serving one deployment of two replicas of a seeded
random-weight ~25M-parameter Llama on the built-in engine (its prefix cache on, bounded by the replica's KV share:
its declared batch x seq). Requests come in groups that share a long prefix and differ in a short suffix, shuffled,
from a fixed number of closed-loop clients, streamed: TTFT is the time to the first streamed token. A random-weight
model on a CPU: the figures show prefill saved by routing, not a real model's speed.

--engine vllm serves the same model on the vllm engine (its CPU build from `make vllm`, or $MODELGRID_VLLM_PYTHON),
its prefix cache on (vLLM's default), one OpenMP thread per replica and the KV cache the replica's reservation gives
(whole GiB, at least 1: at the default sizes 1 GiB, ~43,000 tokens, room for every prefix on every replica; the table
says how many it holds). Off and on serve the same prompts.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from bench.harness import (  # noqa: E402
    command_line,
    deployment,
    median,
    percentile,
    print_header,
    print_table,
    running_stack,
    say,
    wait_until,
)
from console.gateway.predict import Features, Predictor  # noqa: E402
from console.gateway.prefix_index import BLOCK_BYTES, PrefixIndex, block_hashes, prompt_text  # noqa: E402
from console.gateway.routing import least_outstanding, predicted_choice  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("MODELGRID_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
VLLM_START_S = 600  # a cold vLLM on a loaded 2-core machine (tests/e2e/vllm.py's bound)

# -- router cost ---------------------------------------------------------------------------------------------


def _bodies(size: int, rng: random.Random) -> dict[str, tuple[str, dict]]:
    """A completion and a chat body of about `size` bytes of text, parsed as the gateway holds them."""
    text = " ".join(f"word{rng.randrange(10**6)}" for _ in range(size // 11 + 1))[:size]
    return {"completions": ("/v1/completions", {"model": "chat", "prompt": text, "max_tokens": 16}),
            "chat": ("/v1/chat/completions", {"model": "chat", "messages": [
                {"role": "system", "content": text[: size // 2]},
                *({"role": "user" if i % 2 else "assistant", "content": text[size // 2 + i * 500:][:500]}
                  for i in range(max(1, (size - size // 2) // 500)))]})}


def section_cost(args) -> None:
    rng = random.Random(args.seed)
    replicas = list(range(1, args.replicas + 1))
    rows = []
    for size in (1 << 10, 16 << 10, 1 << 20):
        for kind, (path, body) in _bodies(size, rng).items():
            index = PrefixIndex()
            for i in range(args.warm_prefixes):  # other prompts' blocks, so lookups meet a full index
                index.sent(block_hashes(f"{i:08d}" * 2048, "chat\x1f"), replicas[i % len(replicas)])
            outstanding = {r: rng.randrange(4) for r in replicas}
            predictor = Predictor()
            for _ in range(64):  # a fitted model, as after a deployment's first requests
                f = Features(rng.uniform(0, 16), rng.randrange(8))
                predictor.learn("chat", True, f, 0.1, 0.02 + 0.05 * f.uncached_kb + 0.03 * f.in_flight)
            took, turn, reasons = [], 0, Counter()
            for _ in range(args.cost_runs):
                began = time.perf_counter()
                blocks = block_hashes(prompt_text(path, body), "chat\x1f")
                matches = index.matches(blocks, replicas)
                predicted = {r: predictor.predict("chat", True, Features(
                    max(0, size - matches.get(r, 0) * BLOCK_BYTES) / 1024, outstanding[r])) for r in replicas}
                chosen, reason = predicted_choice(predicted, matches, len(blocks), replicas, outstanding, turn)
                index.sent(blocks, chosen)
                took.append(time.perf_counter() - began)
                turn += 1
                reasons[reason.split()[0]] += 1
            base = []
            for _ in range(args.cost_runs):
                began = time.perf_counter()
                least_outstanding(replicas, outstanding, turn)
                base.append(time.perf_counter() - began)
            rows.append({"body": f"{kind} {size >> 10} KiB", "blocks": len(blocks),
                         "p50 us": 1e6 * median(took), "p99 us": 1e6 * percentile(took, 0.99),
                         "least-outstanding alone p50 us": 1e6 * median(base),
                         "index blocks": len(index), "choices": ", ".join(f"{k} {v}" for k, v in reasons.items())})
    print_table(f"Routing decision per request ({args.replicas} replicas, index warmed with {args.warm_prefixes} "
                f"prefixes, {args.cost_runs} decisions each)", rows,
                notes=("Decision: prompt text (bounded) + chain hashes + index lookup + a predicted TTFT per replica "
                       "(predict.py) + choice + index update, on the event loop. Target: at most 100 us.",))


# -- the shared-prefix workload through a console ------------------------------------------------------------

VOCAB_FILLER = (1500, 4096)  # the word tokenizer's filler words w<id>: one token each (bench/generation_models.py)


def workload(groups: int, per_group: int, prefix: int, suffix: int, seed: int) -> list[str]:
    """`groups` x `per_group` prompts of `prefix` shared words then `suffix` own words, shuffled (one token each)."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(f"w{rng.randrange(*VOCAB_FILLER)}" for _ in range(n))

    heads = [words(prefix) for _ in range(groups)]
    prompts = [f"{head} {words(suffix)}" for head in heads for _ in range(per_group)]
    rng.shuffle(prompts)
    return prompts


async def _one(session, url: str, body: dict) -> tuple[float, float, str, str]:
    """(TTFT, whole seconds, replica, routing reason) of one streamed completion; RuntimeError unless it is 200."""
    began = time.perf_counter()
    first = None
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {(await r.text())[:200]}")
        async for line in r.content:
            if first is None and line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                first = time.perf_counter() - began
        return first or float("nan"), time.perf_counter() - began, r.headers["x-modelgrid-replica"], \
            r.headers.get("x-modelgrid-routing", "")


async def closed_loop(url: str, token: str, prompts: list[str], clients: int,
                      new_tokens: int) -> tuple[list, list[str], float]:
    """`prompts` from `clients` closed-loop clients: (each answer's _one figures, each failure's text, seconds)."""
    import aiohttp

    pending = list(enumerate(prompts))
    results, errors = [], []
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def client() -> None:
            while pending:
                _, prompt = pending.pop(0)
                body = {"model": "chat", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0,
                        "stream": True}
                try:
                    results.append(await _one(session, url + "v1/completions", body))
                except (TimeoutError, RuntimeError, aiohttp.ClientError) as e:
                    errors.append(f"{type(e).__name__}: {e}")  # counted in the table, not the end of the run

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return results, errors, time.perf_counter() - began


def prediction_error(stack, deployment: str = "chat") -> str:
    """The gateway's TTFT predictor's mean absolute percentage error for `deployment` (console /metrics)."""
    import httpx

    text = httpx.get(stack.url + "metrics", headers={"Authorization": f"Bearer {stack.token}"}, timeout=60).text
    series = f'modelgrid_gateway_ttft_prediction_mape{{deployment="{deployment}"}} '
    found = re.search("^" + re.escape(series) + r"(\S+)$", text, re.M)
    return f"{100 * float(found.group(1)):.0f}%" if found else "-"


def vllm_prefix_cache(stack) -> tuple[float, float, int]:
    """(hit tokens, queried tokens) of every vLLM replica's prefix cache so far, and the tokens the smallest one
    holds, from vLLM's own metrics that the agent relays."""
    import httpx

    text = httpx.get(stack.url + "metrics/agents/local", headers={"Authorization": f"Bearer {stack.token}"},
                     timeout=60).text
    lines = text.splitlines()

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))

    sizes = []
    for line in lines:
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("num_gpu_blocks", "").isdigit():
                sizes.append(int(labels["num_gpu_blocks"]) * int(labels["block_size"]))
    return total("vllm:prefix_cache_hits_total"), total("vllm:prefix_cache_queries_total"), min(sizes, default=0)


def run_once(args, model: Path, tmp: Path, on: bool, prompts: list[str], warm: list[str]) -> dict:
    from bench.generation_stack import up_args

    gpus, up = up_args("cpu")
    env = {"MODELGRID_GATEWAY_PREFIX_ROUTING": "1" if on else "0"}
    spec = {"name": "chat", "model": "decoder", "replicas": 2, "batch": args.kv_batch, "seq": args.seq,
            "max_batch_size": args.kv_batch}
    vllm = args.engine == "vllm"
    if vllm:
        env |= {"MODELGRID_VLLM_PYTHON": VLLM_PYTHON, "MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS": str(VLLM_START_S)}
        spec["engine"] = "vllm"  # its prefix caching is vLLM's default: no flag
    with running_stack(tmp / ("on" if on else "off"), gpus=gpus, args=up, **env) as stack, stack.api() as api:
        r = api.post("/models", json={"name": "decoder", "path": str(model)})
        assert r.status_code == 201, r.text
        r = api.post("/deployments", json=spec)
        assert r.status_code == 201, r.text
        began = time.monotonic()
        wait_until(lambda: sum(x["state"] == "ready" for x in deployment(api, "chat")["replicas"]) == 2,
                   VLLM_START_S if vllm else 600, "two ready replicas", 0.5, stack)
        say(f"prefix routing {'on' if on else 'off'}: two replicas ready in {time.monotonic() - began:.0f} s; "
            "warming up")
        _, failed, _ = asyncio.run(closed_loop(stack.url, stack.token, warm, 2, 2))
        assert not failed, failed
        before = vllm_prefix_cache(stack) if vllm else (0.0, 0.0, 0)
        say(f"running {len(prompts)} requests from {args.clients} clients")
        results, errors, wall = asyncio.run(closed_loop(stack.url, stack.token, prompts, args.clients,
                                                        args.new_tokens))
        after = vllm_prefix_cache(stack) if vllm else (0.0, 0.0, 0)
        mape = prediction_error(stack)
    for error in sorted(set(errors))[:5]:
        say(f"failed: {error}")
    ttft = [t for t, _, _, _ in results]
    row = {"prefix routing": "on" if on else "off", "requests": len(results), "errors": len(errors),
           "TTFT p50 s": percentile(ttft, 0.5), "TTFT p90 s": percentile(ttft, 0.9),
           "latency p50 s": percentile([w for _, w, _, _ in results], 0.5),
           "req/s": len(results) / wall,
           "per replica": "/".join(str(n) for _, n in sorted(Counter(rep for _, _, rep, _ in results).items())),
           "route reasons": ", ".join(f"{k} {v}" for k, v in
                                      sorted(Counter(x.split()[0] for _, _, _, x in results).items())),
           "TTFT predicted MAPE": mape}
    if vllm:
        hits, queries = after[0] - before[0], after[1] - before[1]
        row["vLLM cache hit tokens"] = f"{100 * hits / queries:.0f}%" if queries else "-"
        row["vLLM cache tokens / replica"] = after[2] or "?"
    return row


def by_prefix(row: dict) -> str:
    """The share of a run's answered requests that the gateway routed by their prefix."""
    reasons = dict(part.rsplit(" ", 1) for part in row["route reasons"].split(", ") if part)
    return f"{100 * int(reasons.get('prefix', 0)) / max(row['requests'], 1):.0f}%"


def prefixes_held(row: dict, args) -> str:
    """How many of the workload's prefixes (and one request's own tokens) a vLLM replica's KV cache holds at once."""
    tokens = row.get("vLLM cache tokens / replica")
    return str(tokens // (args.prefix + args.suffix + args.new_tokens + 1)) if isinstance(tokens, int) else "?"


def section_workload(args) -> None:
    from bench.generation_models import build_decoder
    from bench.prefix_cache import SHAPE

    if args.engine == "vllm" and not Path(VLLM_PYTHON).exists():
        sys.exit(f"no vLLM environment at {VLLM_PYTHON}: run `make vllm` (or set MODELGRID_VLLM_PYTHON)")
    with tempfile.TemporaryDirectory(prefix="bench-prefix-routing-") as name:
        tmp = Path(name)
        model = tmp / "models" / "decoder"
        params = build_decoder(model, SHAPE)
        say(f"built a {params / 1e6:.0f}M-parameter random Llama")
        rows = []
        for i, on in enumerate((False, True) if not args.on_first else (True, False)):
            # Each run a fresh stack: no cache carries over from one to the other. The torch runs each have their
            # own prefixes; vLLM's off and on serve the same prompts.
            seed = args.seed + 1 + (0 if args.engine == "vllm" else i)
            prompts = workload(args.groups, args.per_group, args.prefix, args.suffix, seed)
            warm = workload(2, 2, 8, 4, seed + 99)
            rows.append(run_once(args, model, tmp, on, prompts, warm))
        off, on = sorted(rows, key=lambda r: r["prefix routing"] == "on")
        order = "on, then off" if args.on_first else "off, then on"
        engine = ("the vllm engine (vLLM's CPU build, its prefix cache on, 1 OpenMP thread per replica)"
                  if args.engine == "vllm" else "the built-in engine")
        print_table(f"Shared-prefix workload through the console on {args.engine}: {args.groups} groups x "
                    f"{args.per_group} requests, {args.prefix}-token shared prefix + {args.suffix}-token suffix, "
                    f"{args.new_tokens} new tokens, {args.clients} clients, 2 replicas", [off, on],
                    notes=(f"With prefix routing: TTFT p50 {100 * (on['TTFT p50 s'] / off['TTFT p50 s'] - 1):+.0f}%, "
                           f"p90 {100 * (on['TTFT p90 s'] / off['TTFT p90 s'] - 1):+.0f}% (target: -40% or better); "
                           f"throughput {on['req/s'] / off['req/s']:.2f}x (target: 1x or more). Routed by prefix: "
                           f"{by_prefix(off)} off, {by_prefix(on)} on; errors: {off['errors']} off, "
                           f"{on['errors']} on.",
                           f"Replicas: 2 on {engine}. Each replica's declared KV share: batch {args.kv_batch} x seq "
                           f"{args.seq} tokens" + (", which holds its running sequences and its prefix cache; "
                                                   "random weights, CPU, 1 torch thread per worker."
                                                   if args.engine == "torch" else
                                                   f" (vLLM's --max-model-len); vLLM's own KV cache has room for "
                                                   f"{prefixes_held(on, args)} requests' prefixes and own tokens on "
                                                   f"each replica, against {args.groups} prefix groups. Random "
                                                   "weights, CPU."),
                           f"Order fixed: {order}, each on a fresh `manage.py up`, seed {args.seed}"
                           + (" and the same prompts for both" if args.engine == "vllm" else
                              " (each run its own prefixes)")
                           + ". The second run meets what the first left (a warm OS file cache"
                           + (", vLLM's compile cache under ~/.cache/vllm" if args.engine == "vllm" else "")
                           + ") and the machine as other work has left it by then: its drift falls on one mode "
                             "only. --on-first swaps the order."))


def main() -> None:
    parser = command_line(__doc__, quick="a smoke run: few decisions, a small workload")
    parser.add_argument("--cost", action="store_true", help="only the routing decision's cost")
    parser.add_argument("--workload", action="store_true", help="only the shared-prefix workload through a console")
    parser.add_argument("--replicas", type=int, default=4, help="--cost: replicas to choose among")
    parser.add_argument("--warm-prefixes", type=int, default=2000, help="--cost: prefixes in the index first")
    parser.add_argument("--cost-runs", type=int, help="--cost: decisions per body (default 2000; quick 200)")
    parser.add_argument("--engine", choices=("torch", "vllm"), default="torch",
                        help="--workload: the deployment's engine (vllm: its CPU build, `make vllm`)")
    parser.add_argument("--groups", type=int, help="prefix groups (default 8; quick 4)")
    parser.add_argument("--per-group", type=int, help="requests per group (default 16; quick 4)")
    parser.add_argument("--prefix", type=int, default=896, help="shared prefix, tokens")
    parser.add_argument("--suffix", type=int, default=32, help="each request's own suffix, tokens")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients")
    parser.add_argument("--kv-batch", type=int, default=8, help="each replica's declared batch (sizes its KV share)")
    parser.add_argument("--seq", type=int, default=960, help="each replica's declared tokens per sequence")
    parser.add_argument("--on-first", action="store_true", help="run with prefix routing on first")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    q = args.quick
    args.cost_runs = args.cost_runs or (200 if q else 2000)
    args.groups = args.groups or (4 if q else 8)
    args.per_group = args.per_group or (4 if q else 16)
    both = not args.cost and not args.workload
    print_header("decisions in process; the workload through `manage.py up` with simulated GPUs and CPU workers")
    if args.cost or both:
        section_cost(args)
    if args.workload or both:
        section_workload(args)


if __name__ == "__main__":
    main()
