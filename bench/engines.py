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
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import httpx  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from bench.harness import (  # noqa: E402
    deploy,
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


async def stream_once(client: AsyncOpenAI, model: str, max_tokens: int) -> tuple[float, int]:
    """One streamed completion: (time to its first token, completion tokens by the engine's usage)."""
    began = time.monotonic()
    first, tokens = None, 0
    stream = await client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=1.0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True, "min_tokens": max_tokens})
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.monotonic() - began
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first if first is not None else time.monotonic() - began, tokens


async def load(base_url: str, key: str, model: str, streams: int, requests: int, max_tokens: int) -> dict:
    """`streams` clients each sending `requests` streamed completions back to back."""
    client = AsyncOpenAI(base_url=base_url, api_key=key, timeout=START_S, max_retries=0)
    await stream_once(client, model, 4)  # warm: the first request pays for compiled kernels and caches
    ttfts: list[float] = []
    tokens = 0

    async def one_client() -> None:
        nonlocal tokens
        for _ in range(requests):
            ttft, made = await stream_once(client, model, max_tokens)
            ttfts.append(ttft)
            tokens += made

    began = time.monotonic()
    await asyncio.gather(*(one_client() for _ in range(streams)))
    wall = time.monotonic() - began
    await client.close()
    return {"tokens/s": tokens / wall, "ttft p50 ms": 1000 * percentile(ttfts, 50),
            "ttft p99 ms": 1000 * percentile(ttfts, 99), "requests": len(ttfts), "tokens": tokens}


def start_direct_vllm(model: Path, name: str, dtype: str, kv_gib: int) -> tuple[subprocess.Popen, str]:
    """A vLLM server of the same settings as the agent starts, reached without ModelGrid."""
    port = free_port()
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": str(kv_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    argv = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--disable-uvicorn-access-log"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
    """Seconds from a request to its answer, the deployment not ready when it was sent."""
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
    parser.add_argument("--requests", type=int, default=4, help="requests per stream (default 4)")
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
                deploy(api, name, "m", engine=engine, dtype=args.dtype, min_replicas=0, max_replicas=1,
                       idle_timeout_s=5)
                cold[name] = first_response(stack, api, name)
                say(f"{name}: first response {cold[name]:.1f} s after its deployment was created")
            replica = wait_until(lambda: ready_replica(api, "vllm"), START_S, "vllm ready")
            kv_gib = int(_vllm_env(replica["pid"]).get("VLLM_CPU_KVCACHE_SPACE", "1"))
            base = stack.url.rstrip("/") + "/v1"
            rows = []
            direct, direct_url = start_direct_vllm(model, "vllm", args.dtype, kv_gib)
            try:
                for n in streams:
                    for label, url, key, name in (("built-in, console", base, stack.token, "builtin"),
                                                  ("vLLM, console", base, stack.token, "vllm"),
                                                  ("vLLM, direct", direct_url + "/v1", "unused", "vllm")):
                        say(f"{label}: {n} stream(s) x {args.requests} requests of {args.max_tokens} tokens")
                        result = asyncio.run(load(url, key, name, n, args.requests, args.max_tokens))
                        rows.append({"engine, path": label, "streams": n} | result)
            finally:
                os.killpg(direct.pid, 15)
                direct.wait(30)
            print_table(f"Streams of {args.max_tokens} tokens ({args.requests} per stream), {model.name}, "
                        f"{args.dtype}", rows, notes=("tokens from the engines' usage; ttft: to the first text",))
            share = [(n, next(r for r in rows if r["streams"] == n and r["engine, path"] == "vLLM, console"),
                      next(r for r in rows if r["streams"] == n and r["engine, path"] == "vLLM, direct"))
                     for n in streams]
            print_table("The gateway's share of a vLLM stream", [
                {"streams": n, "direct tokens/s": d["tokens/s"], "console tokens/s": c["tokens/s"],
                 "lost %": 100 * (1 - c["tokens/s"] / d["tokens/s"]) if d["tokens/s"] else None}
                for n, c, d in share])
            idle = {}
            for name in ("builtin", "vllm"):
                wait_until(lambda n=name: ready_replica(api, n) is None, 120 + START_S, f"{name} to leave its GPU",
                           interval=0.5)
                idle[name] = first_response(stack, api, name)
            print_table("Time to first response", [
                {"engine": "built-in", "cold start s": cold["builtin"], "after idle s": idle["builtin"],
                 "after idle": "woken from host memory"},
                {"engine": "vLLM", "cold start s": cold["vllm"], "after idle s": idle["vllm"],
                 "after idle": "started again (vLLM cannot sleep on CPU)"}])
    return 0


def _vllm_env(pid: int) -> dict[str, str]:
    """The environment of the vLLM server under a replica's worker (its KV cache space, to match it directly)."""
    import psutil

    for child in psutil.Process(pid).children():
        if "vllm.entrypoints" in " ".join(child.cmdline()):
            return child.environ()
    return {}

if __name__ == "__main__":
    sys.exit(main())
