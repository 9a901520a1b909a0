"""Prefix-aware routing in the gateway: what a routing decision costs, and what it saves on a shared-prefix workload.

    .venv/bin/python bench/prefix_routing.py --cost              # decision time per request, in process
    .venv/bin/python bench/prefix_routing.py --workload          # TTFT and throughput, routing on vs off
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
"""

from __future__ import annotations

import asyncio
import json
import os
import random
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
    """(TTFT, whole seconds, replica, routing reason) of one streamed completion."""
    began = time.perf_counter()
    first = None
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {await r.text()}")
        async for line in r.content:
            if first is None and line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                first = time.perf_counter() - began
        return first or float("nan"), time.perf_counter() - began, r.headers["x-modelgrid-replica"], \
            r.headers.get("x-modelgrid-routing", "")


async def closed_loop(url: str, token: str, prompts: list[str], clients: int, new_tokens: int) -> tuple[list, float]:
    import aiohttp

    pending = list(enumerate(prompts))
    results = []
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def client() -> None:
            while pending:
                _, prompt = pending.pop(0)
                body = {"model": "chat", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0,
                        "stream": True}
                results.append(await _one(session, url + "v1/completions", body))

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return results, time.perf_counter() - began


def run_once(args, model: Path, tmp: Path, on: bool, prompts: list[str], warm: list[str]) -> dict:
    from bench.generation_stack import up_args

    gpus, up = up_args("cpu")
    env = {"MODELGRID_GATEWAY_PREFIX_ROUTING": "1" if on else "0"}
    with running_stack(tmp / ("on" if on else "off"), gpus=gpus, args=up, **env) as stack, stack.api() as api:
        r = api.post("/models", json={"name": "decoder", "path": str(model)})
        assert r.status_code == 201, r.text
        r = api.post("/deployments", json={"name": "chat", "model": "decoder", "replicas": 2, "batch": args.kv_batch,
                                           "seq": args.seq, "max_batch_size": args.kv_batch})
        assert r.status_code == 201, r.text
        wait_until(lambda: sum(x["state"] == "ready" for x in deployment(api, "chat")["replicas"]) == 2, 600,
                   "two ready replicas", 0.5, stack)
        say(f"prefix routing {'on' if on else 'off'}: two replicas ready; warming up")
        asyncio.run(closed_loop(stack.url, stack.token, warm, 2, 2))
        say(f"running {len(prompts)} requests from {args.clients} clients")
        results, wall = asyncio.run(closed_loop(stack.url, stack.token, prompts, args.clients, args.new_tokens))
    ttft = [t for t, _, _, _ in results]
    return {"prefix routing": "on" if on else "off", "requests": len(results),
            "TTFT p50 s": percentile(ttft, 0.5), "TTFT p90 s": percentile(ttft, 0.9),
            "latency p50 s": percentile([w for _, w, _, _ in results], 0.5),
            "req/s": len(results) / wall,
            "per replica": "/".join(str(n) for _, n in sorted(Counter(rep for _, _, rep, _ in results).items())),
            "route reasons": ", ".join(f"{k} {v}" for k, v in
                                       sorted(Counter(x.split()[0] for _, _, _, x in results).items()))}


def section_workload(args) -> None:
    from bench.generation_models import build_decoder
    from bench.prefix_cache import SHAPE

    with tempfile.TemporaryDirectory(prefix="bench-prefix-routing-") as name:
        tmp = Path(name)
        model = tmp / "models" / "decoder"
        params = build_decoder(model, SHAPE)
        say(f"built a {params / 1e6:.0f}M-parameter random Llama")
        rows = []
        for i, on in enumerate((False, True) if not args.on_first else (True, False)):
            # Each run its own prefixes and a fresh stack: no cache carries over from one to the other.
            prompts = workload(args.groups, args.per_group, args.prefix, args.suffix, args.seed + 1 + i)
            warm = workload(2, 2, 8, 4, args.seed + 100 + i)
            rows.append(run_once(args, model, tmp, on, prompts, warm))
        off, on = sorted(rows, key=lambda r: r["prefix routing"] == "on")
        print_table(f"Shared-prefix workload through the console: {args.groups} groups x {args.per_group} requests, "
                    f"{args.prefix}-token shared prefix + {args.suffix}-token suffix, {args.new_tokens} new tokens, "
                    f"{args.clients} clients, 2 replicas", [off, on],
                    notes=(f"With prefix routing: TTFT p50 {100 * (on['TTFT p50 s'] / off['TTFT p50 s'] - 1):+.0f}%, "
                           f"p90 {100 * (on['TTFT p90 s'] / off['TTFT p90 s'] - 1):+.0f}% (target: -40% or better); "
                           f"throughput {on['req/s'] / off['req/s']:.2f}x (target: 1x or more).",
                           f"Each replica's KV share: batch {args.kv_batch} x seq {args.seq} tokens, which holds "
                           "its running sequences and its prefix cache; random weights, CPU, 1 torch thread per "
                           "worker."))


def main() -> None:
    parser = command_line(__doc__, quick="a smoke run: few decisions, a small workload")
    parser.add_argument("--cost", action="store_true", help="only the routing decision's cost")
    parser.add_argument("--workload", action="store_true", help="only the shared-prefix workload through a console")
    parser.add_argument("--replicas", type=int, default=4, help="--cost: replicas to choose among")
    parser.add_argument("--warm-prefixes", type=int, default=2000, help="--cost: prefixes in the index first")
    parser.add_argument("--cost-runs", type=int, help="--cost: decisions per body (default 2000; quick 200)")
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
