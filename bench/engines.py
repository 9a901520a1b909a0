"""The built-in engine and vLLM, side by side on the same model: streamed completions at 1 and 32 concurrent
streams (tokens/s from the engines' own `usage`, time to first token p50/p99), for the built-in engine through the
console, and for vLLM through the console, through its agent alone and reached directly; then the time
to first response after a cold start and after an idle spell (the built-in engine wakes from host memory; vLLM
on CPU cannot sleep, so it starts again). No assertions on timings: it prints tables.

    make vllm && .venv/bin/python bench/engines.py                 # the tiny 64-wide Llama, ~5 minutes
    .venv/bin/python bench/engines.py --model DIR --dtype bfloat16   # another causal LM (on a GPU host, CUDA vLLM)
    .venv/bin/python bench/engines.py --quick                       # fewer requests
    .venv/bin/python bench/engines.py --pin --streams 32            # vLLM on a core of its own

The gateway's share of a vLLM stream is the throughput lost between the replica's vLLM server reached directly
and through the console, the paths taking turns on the same server. `--pin` gives vLLM a core of its own, as a GPU
gives it its own compute on a GPU host; without it, on a small machine the relays and vLLM fight for cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import aiohttp  # noqa: E402
import httpx  # noqa: E402

from bench.harness import (  # noqa: E402
    command_line,
    deploy,
    gateway_secret,
    percentile,
    print_header,
    print_table,
    ready_replica,
    register,
    running_stack,
    say,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("MODELGRID_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
START_S = 900.0
PROMPT = "The quick brown fox jumps over the lazy dog, and then"


async def stream_once(http: aiohttp.ClientSession, url: str, model: str, max_tokens: int) -> tuple[float, int]:
    """One streamed completion: (time to its first event, completion tokens by the engine's usage). Only the
    usage event is parsed: at thousands of tokens a second on two cores, a client that parses every event is
    what gets measured."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 1.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "min_tokens": max_tokens}
    began = time.monotonic()
    first, tokens = None, 0
    async with http.post(url + "/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{model}: {response.status} {await response.text()}")
        async for line in response.content:
            if first is None and line.startswith(b"data:"):
                first = time.monotonic() - began
            if b'"usage":{' in line:
                tokens = json.loads(line[5:])["usage"]["completion_tokens"]
    return first if first is not None else time.monotonic() - began, tokens


async def load(base_url: str, key: str, model: str, streams: int, requests: int, max_tokens: int) -> dict:
    """`streams` clients each sending `requests` streamed completions back to back, after a round at the same
    concurrency that is not counted (compiled kernels, caches and connections for that batch size)."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=START_S)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}, connector=connector,
                                     timeout=timeout) as http:
        await asyncio.gather(*(stream_once(http, base_url, model, max_tokens) for _ in range(streams)))
        ttfts: list[float] = []
        tokens = 0

        async def one_client() -> None:
            nonlocal tokens
            for _ in range(requests):
                ttft, made = await stream_once(http, base_url, model, max_tokens)
                ttfts.append(ttft)
                tokens += made

        began = time.monotonic()
        await asyncio.gather(*(one_client() for _ in range(streams)))
        wall = time.monotonic() - began
    return {"tokens/s": tokens / wall, "ttfts": ttfts, "tokens": tokens}


def cpu_by_role(stack) -> dict[str, float]:
    """CPU seconds so far of the console, the agent, every vLLM process and the engine's worker, and this client."""
    import psutil

    roles = {"console": 0.0, "agent": 0.0, "vLLM": 0.0, "built-in worker": 0.0, "client": 0.0}
    procs = [psutil.Process(stack.proc.pid)] + stack.descendants()
    procs += [p for p in psutil.process_iter() if p.pid not in {q.pid for q in procs}]
    for proc in procs:
        try:
            line = " ".join(proc.cmdline())
            used = sum(proc.cpu_times()[:2])
        except psutil.Error:
            continue
        if proc.pid == os.getpid():
            roles["client"] += used
        elif "manage.py up" in line:
            roles["console"] += used
        elif "-m agent run" in line:
            roles["agent"] += used
        elif "vllm" in line.lower() or proc.name().startswith("VLLM"):
            roles["vLLM"] += used
        elif "-m agent.workers" in line:
            roles["built-in worker"] += used
    return roles


def measured(stack, run) -> dict:
    """`run`'s figures, and the CPU each role spent in it, per 1,000 tokens (ms)."""
    before = cpu_by_role(stack)
    result = run()
    after = cpu_by_role(stack)
    per = 1e6 / max(result["tokens"], 1)
    return result | {f"{role} cpu ms/1k tok": (after[role] - before[role]) * per for role in after
                     if after[role] - before[role] > 0.005}


def first_response(stack, api, name: str) -> float:
    """Seconds from a request to its answer, the deployment not ready when it was sent (but known to the gateway,
    whose picture of the fleet follows a new deployment within about a second)."""
    headers = {"Authorization": f"Bearer {stack.token}"}
    wait_until(lambda: name in {m["id"] for m in httpx.get(stack.url + "v1/models", headers=headers).json()["data"]},
               10, f"the gateway to list {name}", interval=0.05)
    began = time.monotonic()
    r = httpx.post(stack.url + "v1/completions", headers={"Authorization": f"Bearer {stack.token}"},
                   json={"model": name, "prompt": "hi", "max_tokens": 1}, timeout=START_S)
    r.raise_for_status()
    return time.monotonic() - began


def main() -> int:
    parser = command_line(__doc__, quick="fewer requests (a smoke run, not figures)", whole_doc=True)
    parser.add_argument("--model", type=Path, default=None, help="a causal LM directory (default: tiny-llama-64)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=16, help="requests per stream (default 16)")
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--gpus", default="sim:2x24GiB")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of vLLM's three paths (default 3)")
    parser.add_argument("--pin", action="store_true", help="vLLM on the last core, the rest on the others (and "
                        "vLLM's CPU workers at one thread each)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.max_tokens = 2, 32
    print_header()
    streams = [int(s) for s in args.streams.split(",")]
    if not Path(VLLM_PYTHON).exists():
        print(f"no vLLM environment at {VLLM_PYTHON}: run `make vllm` (or set MODELGRID_VLLM_PYTHON)")
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        model = args.model
        if model is None:
            from agent.workers.demo_models import build_tiny_llama_64

            model = build_tiny_llama_64(Path(tmp) / "tiny-llama-64")
        roots = {"MODELGRID_MODEL_ROOTS": f"{tmp}:{model.resolve().parent}",
                 "MODELGRID_VLLM_PYTHON": VLLM_PYTHON, "MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS": str(int(START_S))}
        up_args = ("--sleep-budget", "8GiB") + (("--cpu-threads", "1") if args.pin else ())
        with running_stack(Path(tmp) / "data", args.gpus, args=up_args, **roots) as stack:
            api = stack.api()
            register(api, "m", model)
            cold = {}
            for name, engine in (("builtin", "torch"), ("vllm", "vllm")):
                deploy(api, name, "m", engine=engine, dtype=args.dtype, min_replicas=0, max_replicas=1)
                cold[name] = first_response(stack, api, name)
                say(f"{name}: first response {cold[name]:.1f} s after its deployment was created")
            direct_url, direct_key = _vllm_server(wait_until(lambda: ready_replica(api, "vllm"), START_S,
                                                             "vllm ready")["pid"])
            base = stack.url.rstrip("/") + "/v1"
            # The agent alone, with its host's secret: what the console's hop costs, apart from the agent's.
            agent = next(h["endpoint"] for h in api.get("/hosts").json() if h["name"] == "local") + "/v1"
            paths = (("vLLM, direct", direct_url + "/v1", direct_key),
                     ("vLLM, agent only", agent, gateway_secret(stack)), ("vLLM, console", base, stack.token))
            runs: dict[tuple[str, int], list[dict]] = {}
            for n in streams:
                runs[("built-in, console", n)] = [measured(stack, lambda n=n: asyncio.run(
                    load(base, stack.token, "builtin", n, args.requests, args.max_tokens)))]
            if args.pin:
                pin_vllm()
            # One vLLM server, its three paths in turns (the order rotating each round): the machine's drift
            # falls on all three alike, and each round's console/direct pair is one estimate of the share.
            for n in streams:
                for r in range(args.rounds):
                    for label, url, key in paths[r % 3:] + paths[:r % 3]:
                        say(f"{label}: {n} stream(s) x {args.requests} requests of {args.max_tokens} tokens, "
                            f"round {r + 1}/{args.rounds}")
                        result = measured(stack, lambda n=n, url=url, key=key: asyncio.run(
                            load(url, key, "vllm", n, args.requests, args.max_tokens)))
                        runs.setdefault((label, n), []).append(result)
            rows = sorted((pooled(label, n, results) for (label, n), results in runs.items()),
                          key=lambda r: r["streams"])
            main_keys = ("engine, path", "streams", "tokens/s", "ttft p50 ms", "ttft p99 ms", "requests", "tokens")
            print_table(f"Streams of {args.max_tokens} tokens ({args.requests} per stream), {model.name}, "
                        f"{args.dtype}" + (", vLLM pinned to its own core" if args.pin else ""),
                        [{k: r[k] for k in main_keys} for r in rows],
                        notes=("tokens from the engines' usage; ttft: to the first event; tokens/s: the median "
                               f"of {args.rounds} rounds for vLLM",))
            roles = ("console", "agent", "vLLM", "built-in worker", "client")
            print_table("Where the CPU went (ms of CPU per 1,000 tokens)", [
                {"engine, path": r["engine, path"], "streams": r["streams"]}
                | {role: r.get(f"{role} cpu ms/1k tok", 0.0) for role in roles} for r in rows])
            share = []
            for n in streams:
                lost = sorted(100 * (1 - c["tokens/s"] / d["tokens/s"])
                              for c, d in zip(runs[("vLLM, console", n)], runs[("vLLM, direct", n)], strict=True))
                share.append({"streams": n, "direct tokens/s": statistics.median(
                    d["tokens/s"] for d in runs[("vLLM, direct", n)]),
                    "console tokens/s": statistics.median(c["tokens/s"] for c in runs[("vLLM, console", n)]),
                    "lost % (median)": statistics.median(lost), "lost % (min..max)": f"{lost[0]:.1f}..{lost[-1]:.1f}"})
            print_table("The gateway's share of a vLLM stream (each round's console run against its direct run)",
                        share)
            unpin()
            idle = {}
            for name in ("builtin", "vllm"):
                api.patch(f"/deployments/{name}", json={"idle_timeout_s": 2})
                wait_until(lambda n=name: ready_replica(api, n) is None and not (n == "vllm" and _vllm_running()),
                           120, f"{name} to leave its GPU", interval=0.5)
                idle[name] = first_response(stack, api, name)
            print_table("Time to first response", [
                {"engine": "built-in", "cold start s": cold["builtin"], "after idle s": idle["builtin"],
                 "after idle": "woken from host memory"},
                {"engine": "vLLM", "cold start s": cold["vllm"], "after idle s": idle["vllm"],
                 "after idle": "started again (vLLM cannot sleep on CPU)"}])
    return 0


def _vllm_server(pid: int) -> tuple[str, str]:
    """The URL and key of the vLLM server under a replica's worker: reached directly, it is the same server the
    gateway's paths reach."""
    import psutil

    for child in psutil.Process(pid).children():
        line = child.cmdline()
        if "vllm.entrypoints" in " ".join(line):
            return f"http://127.0.0.1:{line[line.index('--port') + 1]}", child.environ()["VLLM_API_KEY"]
    raise RuntimeError(f"no vLLM server under worker {pid}")


def _vllm_processes() -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline", "name"])
            if "vllm" in " ".join(p.info["cmdline"] or ()).lower() or (p.info["name"] or "").startswith("VLLM")]


def pin_vllm() -> None:
    """vLLM's processes (every thread) on the last core, everything else on the others: on a GPU host the tokens
    are the GPU's work and the gateway has cores of its own; here that is the only way to see the gateway's
    share apart from the fight for two cores."""
    import psutil

    cores = sorted(os.sched_getaffinity(0))
    vllm = {p.pid for p in _vllm_processes()}
    for proc in psutil.process_iter():
        for thread in proc.threads() if proc.pid in vllm else ():
            _set_affinity(thread.id, cores[-1:])
        if proc.pid not in vllm:
            for thread in _threads(proc):
                _set_affinity(thread.id, cores[:-1])


def unpin() -> None:
    import psutil

    cores = sorted(range(os.cpu_count() or 1))
    for proc in psutil.process_iter():
        for thread in _threads(proc):
            _set_affinity(thread.id, cores)


def _threads(proc) -> list:
    import psutil

    try:
        return proc.threads()
    except psutil.Error:
        return []


def _set_affinity(tid: int, cores: list[int]) -> None:
    try:
        os.sched_setaffinity(tid, cores)
    except OSError:
        pass  # another user's process, or gone


def pooled(label: str, streams: int, results: list[dict]) -> dict:
    """Rounds of one path as one row: the median throughput, TTFT over every request, CPU over every token."""
    ttfts = [t for r in results for t in r["ttfts"]]
    tokens = sum(r["tokens"] for r in results)
    cpu = {k: sum(r.get(k, 0.0) * r["tokens"] for r in results) / tokens for r in results for k in r
           if k.endswith("cpu ms/1k tok")}
    return {"engine, path": label, "streams": streams,
            "tokens/s": statistics.median(r["tokens/s"] for r in results),
            "ttft p50 ms": 1000 * percentile(ttfts, 0.5), "ttft p99 ms": 1000 * percentile(ttfts, 0.99),
            "requests": len(ttfts), "tokens": tokens} | cpu


def _vllm_running() -> bool:
    import psutil

    return any("vllm.entrypoints" in " ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"]))

if __name__ == "__main__":
    sys.exit(main())
