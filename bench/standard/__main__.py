"""The standard serving shapes (fixed prompt/output lengths, shared-prefix buckets, multi-turn chats, a LoRA split
over two adapters of one base, and scale from zero) through ModelGrid's console, and the same shapes against the
replica's vLLM server reached directly, on one model: the ratio ModelGrid / vLLM-direct per shape. GuideLLM runs
the shapes it can express; bench/standard/driver.py the LoRA split (GuideLLM sends one model name per run) and the
cold start. Then bench/lm_eval's two tasks through the console with lm-eval. Prints one table (shape x target)
and writes it, with a plot, under bench/results/.

    make bench                  # starts `manage.py up` on a free loopback port with a temporary data dir
    make bench QUICK=1          # 10 s per shape and target, the vllm engine only: a smoke run (within 10 minutes)
    make bench URL=http://127.0.0.1:8000     # a running ModelGrid; its token in TOKEN (or TOKEN_FILE)
    .venv/bin/python bench/standard --engines vllm --seconds 60

The model is a tiny 2-layer Llama with 64-wide heads (random weights; vLLM's CPU build refuses narrower heads):
the figures are the serving path's, not a model's. Needs `make vllm` for the vllm engine and `.venv-bench`
(requirements-bench.txt) for GuideLLM, lm-eval and matplotlib.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import httpx  # noqa: E402

from bench.harness import (  # noqa: E402
    command_line,
    deploy,
    print_header,
    print_table,
    ready_replica,
    register,
    running_stack,
    say,
    wait_until,
)
from bench.standard import driver  # noqa: E402
from bench.standard.results import NAN, Result, from_records, ratios  # noqa: E402
from bench.standard.shapes import COLD, GUIDELLM, SHAPES, Shape, seconds_per_shape  # noqa: E402
from bench.standard.tools import BENCH_VENV, run_guidellm, run_lm_eval  # noqa: E402

VLLM_PYTHON = os.environ.get("MODELGRID_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
RESULTS = ROOT / "bench" / "results"
START_S = 900.0
WARMUP_S = 3.0
ENGINE_LABEL = {"torch": "ModelGrid, torch engine", "vllm": "ModelGrid, vllm engine"}
DIRECT = "vLLM direct"


@dataclass(frozen=True)
class Target:
    """Somewhere to send the shapes: an OpenAI-style server (`url` without /v1), the model to name, and for the
    LoRA split the model names to draw from by weight (a route does the split on the console)."""

    label: str
    url: str
    key: str
    model: str
    split: tuple[tuple[str, int], ...]


@dataclass
class Console:
    url: str
    token: str
    api: httpx.Client


@contextlib.contextmanager
def console(url: str | None, tmp: Path) -> Iterator[Console]:
    """A running ModelGrid at `url` (its token in TOKEN or TOKEN_FILE), or `manage.py up` started for the run."""
    if url:
        token = os.environ.get("TOKEN") or (Path(os.environ["TOKEN_FILE"]).read_text().strip()
                                            if os.environ.get("TOKEN_FILE") else "")
        if not token:
            raise SystemExit("URL= needs an API token in TOKEN (or a file named by TOKEN_FILE)")
        url = url.rstrip("/")
        yield Console(url, token, httpx.Client(base_url=url + "/api/v1", timeout=60,
                                               headers={"Authorization": f"Bearer {token}"}))
        return
    env = {"MODELGRID_VLLM_PYTHON": VLLM_PYTHON, "MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS": str(int(START_S)),
           "MODELGRID_MODEL_ROOTS": str(tmp)}
    with running_stack(tmp / "data", "sim:1x24GiB", **env) as stack:
        yield Console(stack.url.rstrip("/"), stack.token, stack.api())


def build_model(directory: Path) -> Path:
    """The tiny 64-wide Llama and two rank-8 LoRA adapters of it (on up_proj, different seeds) beside it."""
    from agent.workers.demo_models import build_tiny_llama_64
    from tests.adapter_files import write_adapter

    if not (directory / "model.safetensors").exists():
        build_tiny_llama_64(directory)
    for i in (1, 2):
        write_adapter(directory.parent / f"{directory.name}-lora{i}",
                      {f"model.layers.{n}.mlp.up_proj": (8, 128, 256) for n in range(2)}, seed=i)
    return directory


def direct_target(api: httpx.Client, deployment: str, adapters: list[str]) -> Target | None:
    """The vLLM server under the deployment's replica, reached directly with its own key (the same server the
    console's requests reach); None where it is not on this machine."""
    import psutil

    from bench.engines import _vllm_server

    replica = ready_replica(api, deployment) or {}
    try:
        url, key = _vllm_server(replica.get("pid") or 0)
    except (psutil.Error, RuntimeError, KeyError, ValueError) as e:  # another machine's pid, or another user's
        say(f"no vLLM server of {deployment} reachable on this machine ({e}): no vLLM-direct rows")
        return None
    models = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    served = next(m["id"] for m in models if not m.get("parent"))
    missing = set(adapters) - {m["id"] for m in models}
    if missing:
        raise RuntimeError(f"vLLM under {deployment} does not serve {sorted(missing)}")
    return Target(DIRECT, url, key, served, tuple((a, 1) for a in adapters))


def run_shape(shape: Shape, target: Target, *, model_dir: Path, seconds: float, work: Path) -> Result:
    say(f"{shape.name} -> {target.label}: {shape.streams} streams, {seconds:.0f} s")
    if shape.tool == GUIDELLM:
        return run_guidellm(shape, label=target.label, base_url=target.url, model=target.model, api_key=target.key,
                            tokenizer=model_dir, seconds=seconds, workdir=work)
    texts = driver.prompts(model_dir, shape.prompt_tokens, 64)
    records, wall = asyncio.run(driver.split_load(target.url, target.key, list(target.split), texts,
                                                  shape.output_tokens, shape.streams, seconds))
    slug = f"{shape.name}-{target.label}".replace(" ", "_").replace(",", "")
    (work / f"{slug}.records.json").write_text(json.dumps({"wall_s": wall, "records": [asdict(r) for r in records]}))
    return from_records(records, wall, shape.name, target.label)


def cold_start(console: Console, name: str, label: str, model_dir: Path) -> Result:
    """The first request's TTFT at a deployment that has no replica (once the gateway lists it)."""
    headers = {"Authorization": f"Bearer {console.token}"}
    wait_until(lambda: name in {m["id"] for m in httpx.get(console.url + "/v1/models", headers=headers).json()["data"]},
               30, f"the gateway to list {name}", interval=0.1)
    shape = next(s for s in SHAPES if s.name == COLD)
    began = time.monotonic()
    record = asyncio.run(driver.cold_request(console.url, console.token, name,
                                             driver.prompts(model_dir, shape.prompt_tokens, 1)[0],
                                             shape.output_tokens))
    # one request: its TTFT and ITL are the figures, not a rate
    return replace(from_records([record], time.monotonic() - began, COLD, label, note="first request after creation"),
                   output_tokens_per_s=NAN, requests_per_s=NAN)


def vllm_server_cold_start(model_dir: Path) -> Result:
    """vLLM's own cold start: `api_server` launched, to the first token of one streamed request."""
    import secrets

    from tests.e2e.stack import free_port

    port, key = free_port(), secrets.token_urlsafe(16)
    env = os.environ | {"VLLM_API_KEY": key, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    args = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host",
            "127.0.0.1", "--port", str(port), "--served-model-name", "m", "--max-model-len", "256"]
    shape = next(s for s in SHAPES if s.name == COLD)
    prompt = driver.prompts(model_dir, shape.prompt_tokens, 1)[0]
    url = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until(lambda: proc.poll() is not None or _healthy(url), START_S, "vLLM's api_server", interval=0.2)
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"vLLM exited {proc.returncode}: {log.read()[-2000:].decode(errors='replace')}")
            waited = time.monotonic() - began
            record = asyncio.run(driver.cold_request(url, key, "m", prompt, shape.output_tokens))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    launched = replace(record, ttft_s=waited + record.ttft_s, total_s=waited + record.total_s)
    return replace(from_records([launched], launched.total_s, COLD, DIRECT, note="api_server launched -> first token"),
                   output_tokens_per_s=NAN, requests_per_s=NAN)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def bench_engine(console: Console, engine: str, *, model: str, model_dir: Path, seconds: float,
                 work: Path) -> list[Result]:
    """Every shape through the console on one engine (and against its vLLM server directly, for vllm); the
    deployment, its adapters and its route are deleted on the way out."""
    api, label = console.api, ENGINE_LABEL[engine]
    name, route = f"bench-{engine}", f"bench-{engine}-split"
    adapters = [f"bench-{engine}-a{i}" for i in (1, 2)]
    deploy(api, name, model, engine=engine, dtype="float32", min_replicas=0, max_replicas=1, idle_timeout_s=3600)
    results: list[Result] = []
    try:
        for i, adapter in enumerate(adapters, 1):  # registered before its first request: vLLM starts with LoRA on
            r = api.post("/adapters", json={"name": adapter, "deployment": name,
                                            "path": str(model_dir.parent / f"{model_dir.name}-lora{i}")})
            if r.status_code != 201:
                raise RuntimeError(f"POST /adapters {adapter}: {r.status_code} {r.text}")
        r = api.post("/routes", json={"name": route, "branches": [
            {"deployment": name, "adapter": a, "weight": 1} for a in adapters]})
        if r.status_code != 201:
            raise RuntimeError(f"POST /routes {route}: {r.status_code} {r.text}")
        results.append(cold_start(console, name, label, model_dir))
        say(f"{label}: first token {results[-1].ttft_p50_ms / 1000:.1f} s after a request to a cold deployment")
        wait_until(lambda: len((ready_replica(api, name) or {}).get("adapter_stats") or ()) == 2, START_S,
                   f"{name}'s two adapters", interval=0.5)
        targets = [Target(label, console.url, console.token, name, ((route, 1),))]
        if engine == "vllm" and (direct := direct_target(api, name, adapters)):
            targets.append(direct)
        for target in targets:  # not counted: whichever path went first would pay for the server's first batches
            say(f"warming up {target.label}")
            asyncio.run(driver.split_load(target.url, target.key, [(target.model, 1)], driver.prompts(model_dir, 64, 8),
                                          16, 8, WARMUP_S))
        for shape in (s for s in SHAPES if s.name != COLD):
            for target in targets:  # the paths take turns shape by shape: the machine's drift falls on both
                results.append(run_shape(shape, target, model_dir=model_dir, seconds=seconds, work=work))
    finally:
        api.delete(f"/routes/{route}")
        api.delete(f"/deployments/{name}")
    return results


def evaluate(console: Console, *, model: str, model_dir: Path, work: Path) -> dict:
    """bench/lm_eval's tasks through the console, on a torch-engine deployment of its own without adapters: vLLM
    0.32's CPU build crashes its engine core on echo with logprobs while LoRA is on (docs/engines.md), and one
    more vLLM start would not fit QUICK's budget."""
    name = "bench-eval"
    deploy(console.api, name, model, engine="torch", dtype="float32", min_replicas=0, max_replicas=1)
    try:
        say(f"lm-eval through the console ({name}, torch engine)")
        return run_lm_eval(base_url=console.url, model=name, api_key=console.token, tokenizer=model_dir, workdir=work)
    finally:
        console.api.delete(f"/deployments/{name}")


def main() -> int:
    parser = command_line(__doc__, quick="10 s per shape and target, the vllm engine only (a smoke run, not "
                          "figures)", whole_doc=True)
    parser.add_argument("--url", default=None, help="a running ModelGrid's URL (token in TOKEN or TOKEN_FILE); "
                        "default: start `manage.py up` for the run")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="where the tiny Llama is built (default: a temporary directory; with --url, "
                        "var/models/bench-llama64, inside `make run`'s model root)")
    parser.add_argument("--engines", default=None, help="ModelGrid engines to deploy on, in turn (default: "
                        "torch,vllm; with --quick, vllm)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per shape and target")
    args = parser.parse_args()
    seconds = args.seconds or seconds_per_shape(args.quick)
    engines = [e for e in (args.engines or ("vllm" if args.quick else "torch,vllm")).split(",") if e]
    if "vllm" in engines and not Path(VLLM_PYTHON).exists():
        print(f"no vLLM environment at {VLLM_PYTHON}: run `make vllm` (or set MODELGRID_VLLM_PYTHON)")
        return 2
    if not (BENCH_VENV / "bin" / "guidellm").exists():
        print(f"no {BENCH_VENV}: `make bench` installs requirements-bench.txt there")
        return 2
    print_header(f"shapes: {seconds:.0f} s per shape and target; engines: {', '.join(engines)}"
                 + (f"; ModelGrid at {args.url}" if args.url else "; ModelGrid: manage.py up, sim:1x24GiB"),
                 f"tools: {_versions()} ({BENCH_VENV.name}); load average at the start: {_load()} (other work on "
                 "this machine shares its cores)")
    began = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = RESULTS / f"standard-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    evals: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-standard-") as tmp:
        default_dir = ROOT / "var" / "models" / "bench-llama64" if args.url else Path(tmp) / "llama64"
        model_dir = build_model((args.model_dir or default_dir).resolve())
        with console(args.url, Path(tmp)) as grid:
            model = "bench-llama64"
            register(grid.api, model, model_dir)
            try:
                for engine in engines:
                    results += bench_engine(grid, engine, model=model, model_dir=model_dir, seconds=seconds,
                                            work=work)
                evals[ENGINE_LABEL["torch"]] = evaluate(grid, model=model, model_dir=model_dir, work=work)
            finally:
                wait_until(lambda: grid.api.delete(f"/models/{model}").status_code in (204, 404), 60,
                           f"model {model} to be deleted", interval=0.5)
        if "vllm" in engines and not args.quick and not args.url:
            say("vLLM's own cold start: api_server launched -> first token")
            results.append(vllm_server_cold_start(model_dir))
    report(results, evals, seconds, work, time.monotonic() - began)
    return 0


def report(results: list[Result], evals: dict, seconds: float, work: Path, took: float) -> None:
    """The table, the ratios, lm-eval's scores; then the JSON beside GuideLLM's reports, and its plot."""
    order = {s.name: i for i, s in enumerate(SHAPES)}
    results = sorted(results, key=lambda r: order[r.shape])
    shapes = "; ".join(f"{s.name}: {s.what}" + (f" ({s.streams} streams)" if s.name != COLD else "")
                       for s in SHAPES)
    print_table("Standard shapes (shape x target)", [r.row() for r in results], notes=(
        f"shapes: {shapes}.",
        f"{seconds:.0f} s per shape and target. by GuideLLM: its own percentiles and its mean rates of successful "
        "requests; by driver: bench/standard/driver.py (nearest-rank percentiles, tokens by the server's usage). "
        "errors -1: the tool failed (the reason is in the JSON). Tiny random-weight model on CPU: the serving "
        "path's costs, not a model's."))
    for r in results:
        if r.note and r.errors < 0:
            print(f"{r.shape}, {r.target}: {r.note}")
    engines = {r.target for r in results}
    if DIRECT in engines and ENGINE_LABEL["vllm"] in engines:
        print_table("ModelGrid (vllm engine, through the console) / vLLM direct, the same server",
                    ratios(results, ENGINE_LABEL["vllm"], DIRECT),
                    notes=("output tok/s ratio above 1: ModelGrid faster; TTFT and ITL ratios above 1: slower.",))
    if evals:
        print_table("lm-eval through the console (bench/lm_eval's tasks; random weights, so chance-level scores)",
                    [{"target": t, "task": task} | metrics for t, scores in evals.items() if "error" not in scores
                     for task, metrics in scores.items()],
                    notes=tuple(f"{t}: {scores['error'][-300:]}" for t, scores in evals.items() if "error" in scores))
    data = work / "standard.json"
    data.write_text(json.dumps({"results": [r.as_dict() for r in results], "lm_eval": evals, "seconds": seconds,
                                "took_s": took}, indent=1))
    plot = work / "standard.png"
    done = subprocess.run([str(BENCH_VENV / "bin" / "python"), str(Path(__file__).with_name("plot.py")), str(data),
                           str(plot)], capture_output=True, text=True)
    print(f"\nwritten: {data.relative_to(ROOT)}" + (f", {plot.relative_to(ROOT)}" if done.returncode == 0 else
                                                   f" (no plot: {done.stderr.strip()[-300:]})"))
    print(f"took {took:.0f} s; load average at the end: {_load()}")


def _versions() -> str:
    found = {p.name.split("-")[0]: p.name.removesuffix(".dist-info").split("-")[1]
             for p in BENCH_VENV.glob("lib/python*/site-packages/*.dist-info")}
    return ", ".join(f"{name} {found.get(name, '?')}" for name in ("guidellm", "lm_eval"))


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
