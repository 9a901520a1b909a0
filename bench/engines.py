"""The built-in engine and vLLM, side by side on the same model: streamed completions at 1 and 32 concurrent
streams (tokens/s from the engines' own `usage`, time to first token p50/p99), for the built-in engine through the
console, for vLLM through the console and for a vLLM server of the same settings reached directly; then the time
to first response after a cold start and after an idle spell (the built-in engine wakes from host memory; vLLM
on CPU cannot sleep, so it starts again). No assertions on timings: it prints tables.

    make vllm && .venv/bin/python bench/engines.py                 # the tiny 64-wide Llama, ~5 minutes
    .venv/bin/python bench/engines.py --model DIR --dtype bfloat16   # another causal LM (on a GPU host, CUDA vLLM)
    .venv/bin/python bench/engines.py --quick                       # fewer requests

The gateway's share of a vLLM stream is the throughput lost between direct and through the console.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
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
    deploy,
    gateway_secret,
    percentile,
    print_table,
    ready_replica,
    register,
    running_stack,
    say,
    wait_until,
)
from tests.e2e.stack import free_port  # noqa: E402

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
    return {"tokens/s": tokens / wall, "ttft p50 ms": 1000 * percentile(ttfts, 0.5),
            "ttft p99 ms": 1000 * percentile(ttfts, 0.99), "requests": len(ttfts), "tokens": tokens}


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


def start_direct_vllm(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """A vLLM server with a replica's own command line and environment (a port of its own, no key), reached
    without ModelGrid."""
    port = free_port()
    at = argv.index("--port")
    argv = argv[:at + 1] + [str(port)] + argv[at + 2:]
    proc = subprocess.Popen(argv, env=os.environ | env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: proc.poll() is not None or _healthy(url), START_S, "the direct vLLM server")
    if proc.poll() is not None:
        raise RuntimeError(f"the direct vLLM server exited with {proc.returncode}")
    return proc, url


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a causal LM directory (default: tiny-llama-64)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=16, help="requests per stream (default 16)")
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--gpus", default="sim:2x24GiB")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.max_tokens = 2, 32
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
        with running_stack(Path(tmp) / "data", args.gpus, args=("--sleep-budget", "8GiB"), **roots) as stack:
            api = stack.api()
            register(api, "m", model)
            cold = {}
            for name, engine in (("builtin", "torch"), ("vllm", "vllm")):
                deploy(api, name, "m", engine=engine, dtype=args.dtype, min_replicas=0, max_replicas=1)
                cold[name] = first_response(stack, api, name)
                say(f"{name}: first response {cold[name]:.1f} s after its deployment was created")
            argv, env = _vllm_server(wait_until(lambda: ready_replica(api, "vllm"), START_S, "vllm ready")["pid"])
            base = stack.url.rstrip("/") + "/v1"
            # The agent alone, with its host's secret: what the console's hop costs, apart from the agent's.
            agent = next(h["endpoint"] for h in api.get("/hosts").json() if h["name"] == "local") + "/v1"
            secret = gateway_secret(stack)
            rows = []
            for label, url, key, name in (("built-in, console", base, stack.token, "builtin"),
                                          ("vLLM, console", base, stack.token, "vllm"),
                                          ("vLLM, agent only", agent, secret, "vllm")):
                for n in streams:
                    say(f"{label}: {n} stream(s) x {args.requests} requests of {args.max_tokens} tokens")
                    result = measured(stack, lambda n=n, url=url, key=key, name=name: asyncio.run(
                        load(url, key, name, n, args.requests, args.max_tokens)))
                    rows.append({"engine, path": label, "streams": n} | result)
            # The same server alone: the replica's vLLM gone first, so that one vLLM runs at a time.
            api.patch("/deployments/vllm", json={"min_replicas": 0, "max_replicas": 0})
            wait_until(lambda: not _vllm_running(), 120, "the replica's vLLM to stop", interval=0.5)
            direct, direct_url = start_direct_vllm(argv, env)
            try:
                for n in streams:
                    say(f"vLLM, direct: {n} stream(s) x {args.requests} requests of {args.max_tokens} tokens")
                    result = measured(stack, lambda n=n: asyncio.run(
                        load(direct_url + "/v1", "unused", "vllm", n, args.requests, args.max_tokens)))
                    rows.append({"engine, path": "vLLM, direct", "streams": n} | result)
            finally:
                os.killpg(direct.pid, 15)
                direct.wait(30)
            rows.sort(key=lambda r: r["streams"])
            main_keys = ("engine, path", "streams", "tokens/s", "ttft p50 ms", "ttft p99 ms", "requests", "tokens")
            print_table(f"Streams of {args.max_tokens} tokens ({args.requests} per stream), {model.name}, "
                        f"{args.dtype}", [{k: r[k] for k in main_keys} for r in rows],
                        notes=("tokens from the engines' usage; ttft: to the first event",))
            roles = ("console", "agent", "vLLM", "built-in worker", "client")
            print_table("Where the CPU went (ms of CPU per 1,000 tokens)", [
                {"engine, path": r["engine, path"], "streams": r["streams"]}
                | {role: r.get(f"{role} cpu ms/1k tok", 0.0) for role in roles} for r in rows])
            share = [(n, next(r for r in rows if r["streams"] == n and r["engine, path"] == "vLLM, console"),
                      next(r for r in rows if r["streams"] == n and r["engine, path"] == "vLLM, direct"))
                     for n in streams]
            print_table("The gateway's share of a vLLM stream", [
                {"streams": n, "direct tokens/s": d["tokens/s"], "console tokens/s": c["tokens/s"],
                 "lost %": 100 * (1 - c["tokens/s"] / d["tokens/s"]) if d["tokens/s"] else None}
                for n, c, d in share])
            idle = {}
            api.patch("/deployments/vllm", json={"max_replicas": 1})
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


def _vllm_server(pid: int) -> tuple[list[str], dict[str, str]]:
    """The command line and the environment ModelGrid gave the vLLM server under a replica's worker (its key left
    out)."""
    import psutil

    for child in psutil.Process(pid).children():
        if "vllm.entrypoints" in " ".join(child.cmdline()):
            env = {k: v for k, v in child.environ().items() if k.startswith(("VLLM_", "OMP_", "CUDA_"))
                   and k != "VLLM_API_KEY"}
            return child.cmdline(), env
    raise RuntimeError(f"no vLLM server under worker {pid}")


def _vllm_running() -> bool:
    import psutil

    return any("vllm.entrypoints" in " ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"]))

if __name__ == "__main__":
    sys.exit(main())
