"""Time to first token on the built-in engine with its prefix cache on and off, on a shared-prefix workload.

Requests come in groups that share a long prompt prefix (a system prompt, few-shot examples) and differ in a short
suffix, shuffled, from a fixed number of clients that each send their next request when the last one ends (closed
loop). One replica's engine runs in this process: agent.workers.runtime loads the model as its worker does, and the
continuous batcher is built as the worker builds it, with a prefix cache bounded by a KV share of some full-length
sequences (the replica's declared batch); "off" is the same batcher without the cache. Submissions go in between
steps, as the worker's loop takes them. A seeded random-weight Llama on the CPU unless --device says otherwise: the
figures show the prefill saved, not a real model's speed. Greedy outputs with and without the cache are compared,
request by request.
"""

from __future__ import annotations

import contextlib
import random
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from agent.workers import runtime  # noqa: E402
from agent.workers.continuous import ContinuousBatcher  # noqa: E402
from agent.workers.generation_spec import GenerationRequest  # noqa: E402
from agent.workers.prefix_cache import PrefixCache  # noqa: E402
from agent.workers.spec import WorkerSpec  # noqa: E402
from bench.generation_models import DecoderShape, build_decoder  # noqa: E402
from bench.harness import command_line, median, percentile, print_header, print_table, say  # noqa: E402

# ~25M parameters: a 544-token prefill takes a few hundred milliseconds on one CPU thread, a decoding step a few.
SHAPE = DecoderShape(hidden=512, layers=6, heads=8, kv_heads=8, intermediate=1408, vocab=4096, positions=1024)


def workload(groups: int, per_group: int, prefix: int, suffix: int, new_tokens: int, seed: int = 0):
    """`groups` x `per_group` greedy requests: a group's share its `prefix` tokens; each has its own `suffix`."""
    rng = random.Random(seed)
    heads = [[rng.randrange(3, SHAPE.vocab) for _ in range(prefix)] for _ in range(groups)]
    requests = [GenerationRequest(tuple(head + [rng.randrange(3, SHAPE.vocab) for _ in range(suffix)]),
                                  new_tokens, temperature=0) for head in heads for _ in range(per_group)]
    rng.shuffle(requests)
    return requests


def serve(engine: ContinuousBatcher, requests: list[GenerationRequest], clients: int, device: torch.device):
    """Run `requests` from `clients` closed-loop clients; (TTFT seconds, outputs, wall seconds), by request."""
    pending = deque(enumerate(requests))
    sent, ttft, outputs = {}, {}, {}
    began = time.perf_counter()
    while pending or engine.busy:
        while pending and len(sent) - len(outputs) < clients:
            rid, request = pending.popleft()
            engine.submit(rid, request)
            sent[rid] = time.perf_counter()
        for part in engine.phases():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            for token in part.tokens:
                ttft.setdefault(token.request_id, now - sent[token.request_id])
            outputs.update((rid, result.token_ids) for rid, result in part.finished)
            if part.failed:
                raise RuntimeError(f"request {part.failed[0].request_id} failed: {part.failed[0].text}")
    return ttft, outputs, time.perf_counter() - began


def main() -> None:
    parser = command_line(__doc__, quick="2 groups of 2 with 64-token prefixes, one run: a smoke run")
    parser.add_argument("--groups", type=int, default=8, help="prefixes (default 8)")
    parser.add_argument("--per-group", type=int, default=16, help="requests sharing each prefix (default 16)")
    parser.add_argument("--prefix", type=int, default=512, help="shared prefix tokens (default 512)")
    parser.add_argument("--suffix", type=int, default=32, help="each request's own tokens after it (default 32)")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per request (default 16)")
    parser.add_argument("--clients", type=int, default=4, help="requests in flight (default 4)")
    parser.add_argument("--shares", default="4,16",
                        help="KV shares to run the cache with, as the replica's declared batch of full-length "
                             "sequences (default 4,16)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each, interleaved (default 2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    args = parser.parse_args()
    if args.quick:
        args.groups, args.per_group, args.prefix, args.runs = 2, 2, 64, 1
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        params = build_decoder(Path(tmp) / "decoder", SHAPE)
        replica = runtime.load(WorkerSpec(0, str(Path(tmp) / "decoder"), "causal-lm", args.device, batch=1,
                                          threads=args.threads if args.device == "cpu" else None))
    sequence_bytes = replica.kv_capacity_bytes()  # one full-length sequence: the runtime's KV share per batch row
    shares = [int(b) for b in args.shares.split(",")]
    print_header(f"torch {torch.__version__}, device {args.device}, {args.threads} torch threads, float32",
                 f"model: seeded random-weight Llama, {params / 1e6:.1f}M parameters ({SHAPE.layers} layers, hidden "
                 f"{SHAPE.hidden}), {SHAPE.positions} positions, {sequence_bytes / 2**20:.0f} MiB of KV per "
                 "full-length sequence",
                 f"workload: {args.groups} groups x {args.per_group} requests, {args.prefix}-token shared prefix + "
                 f"{args.suffix}-token suffix, {args.new_tokens} new tokens each, {args.clients} clients, shuffled; "
                 f"{args.runs} runs of each, interleaved")
    requests = workload(args.groups, args.per_group, args.prefix, args.suffix, args.new_tokens)
    warmup = workload(1, 2, 32, 8, 2, seed=1)
    setups = {"off": None} | {f"on, KV share {b} x {SHAPE.positions}": b * sequence_bytes for b in shares}
    seconds = {name: [] for name in setups}
    totals = {name: {"prefill": 0, "hits": 0, "lookups": 0, "hit tokens": 0, "MiB": 0.0, "wall": 0.0}
              for name in setups}
    outputs = {}
    for run in range(args.runs):
        for name, capacity in setups.items():
            engine = ContinuousBatcher(replica.model, lambda names: contextlib.nullcontext(),
                                       max_positions=replica.max_positions,
                                       prefix_cache=PrefixCache(capacity) if capacity else None)
            serve(engine, warmup, args.clients, replica.device)
            before = engine.stats()
            say(f"run {run + 1}, cache {name}: {len(requests)} requests")
            ttft, outputs[name], wall = serve(engine, requests, args.clients, replica.device)
            after, total = engine.stats(), totals[name]
            seconds[name] += ttft.values()
            total["prefill"] += after.prefill_tokens - before.prefill_tokens
            total["hits"] += after.prefix_hits - before.prefix_hits
            total["lookups"] += (after.prefix_hits + after.prefix_misses) - (before.prefix_hits + before.prefix_misses)
            total["hit tokens"] += after.prefix_hit_tokens - before.prefix_hit_tokens
            total["MiB"] = max(total["MiB"], after.prefix_cache_bytes / 2**20)
            total["wall"] += wall
    rows = []
    for name, total in totals.items():
        times = seconds[name]
        rows.append({"prefix cache": name, "requests": len(times),
                     "TTFT p50 ms": median(times) * 1e3, "TTFT p90 ms": percentile(times, 0.9) * 1e3,
                     "prefill tokens / run": total["prefill"] // args.runs,
                     "hits / lookups": f"{total['hits']} / {total['lookups']}",
                     "hit tokens / run": total["hit tokens"] // args.runs, "cache MiB at end": total["MiB"],
                     "requests/s": len(times) / total["wall"]})
    off = outputs["off"]
    same = [sum(outputs[name][rid] == off[rid] for rid in range(len(requests))) for name in list(setups)[1:]]
    print_table("TTFT with the prefix cache off and on (one engine, in process)", rows,
                notes=(f"greedy outputs identical to the cache off, request by request: {same} of {len(requests)}",))


if __name__ == "__main__":
    main()
