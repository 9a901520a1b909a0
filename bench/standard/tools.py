"""GuideLLM and lm-eval, run from the bench's own environment (.venv-bench: their pins differ from ours), and
their reports read back. The API key goes in a file only this user can read (GuideLLM's scenario) or in the
child's environment (lm-eval's OPENAI_API_KEY), never on a command line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from bench.standard.results import Result, from_guidellm
from bench.standard.shapes import Shape, scenario

ROOT = Path(__file__).resolve().parents[2]
BENCH_VENV = Path(os.environ.get("MODELGRID_BENCH_VENV", ROOT / ".venv-bench"))
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def tool(name: str) -> Path:
    """A console script of the bench environment; FileNotFoundError saying how to make it."""
    path = BENCH_VENV / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `make bench` installs requirements-bench.txt into {BENCH_VENV}")
    return path


def _private(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _redact(log: Path, secret: str) -> None:
    """The key out of a tool's log: lm-eval writes a failed request's headers, bearer token and all."""
    text = log.read_text(errors="replace")
    if secret and secret in text:
        log.write_text(text.replace(secret, "[key]"))


def _tail(log: Path, lines: int = 15) -> str:
    return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def run_guidellm(shape: Shape, *, label: str, base_url: str, model: str, api_key: str, tokenizer: Path,
                 seconds: float, workdir: Path) -> Result:
    """One GuideLLM run of `shape` against an OpenAI-style server at `base_url` (no /v1), its report parsed; a
    run that fails is a row of errors with the reason in its note, so the others still run."""
    slug = f"{shape.name}-{label}".replace(" ", "_").replace("/", "_").replace(",", "")
    config = _private(workdir / f"{slug}.scenario.json", json.dumps(scenario(
        shape, target=base_url, model=model, api_key=api_key, tokenizer=str(tokenizer), seconds=seconds)))
    report, log = workdir / f"{slug}.json", workdir / f"{slug}.log"
    try:
        with log.open("w") as out:
            args = [str(tool("guidellm")), "run", "-c", str(config), "--output", f"kind=json,path={report}",
                    "--disable-console"]
            done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, env=os.environ | OFFLINE, cwd=workdir,
                                  timeout=seconds + 600)
    finally:
        config.unlink()  # the key's only copy on disk (GuideLLM's report masks it)
        _redact(log, api_key)
    if done.returncode != 0 or not report.exists():
        return Result(shape.name, label, tool="GuideLLM",
                      note=f"guidellm exited {done.returncode}: {_tail(log, 3).strip()}", errors=-1)
    return from_guidellm(json.loads(report.read_text()), shape.name, label)


LM_EVAL_TASKS = ("modelgrid_tiny_mc", "modelgrid_tiny_gen")


def run_lm_eval(*, base_url: str, model: str, api_key: str, tokenizer: Path, workdir: Path) -> dict:
    """bench/lm_eval's two tasks through an OpenAI-style /v1/completions (log-likelihood by echo, and generation):
    their scores, or {"error": why}."""
    out, log = workdir / f"lm_eval-{model}", workdir / f"lm_eval-{model}.log"
    args = [str(tool("lm_eval")), "--model", "local-completions", "--include_path", str(ROOT / "bench" / "lm_eval"),
            "--tasks", ",".join(LM_EVAL_TASKS), "--output_path", str(out),
            "--model_args", f"model={model},base_url={base_url}/v1/completions,tokenizer={tokenizer},"
            "tokenized_requests=False,num_concurrent=4,max_retries=1"]
    try:
        with log.open("w") as f:
            done = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=900,
                                  env=os.environ | OFFLINE | {"OPENAI_API_KEY": api_key})
    finally:
        _redact(log, api_key)
    found = sorted(out.rglob("results_*.json"))
    if done.returncode != 0 or not found:
        return {"error": f"lm_eval exited {done.returncode}: {_tail(log, 3).strip()}"}
    return lm_eval_scores(json.loads(found[-1].read_text()))


def lm_eval_scores(report: dict) -> dict:
    """{task: {metric: value}} from lm-eval's results file, the metrics without their filter suffix (`acc,none`
    is `acc`) and without their standard errors."""
    scores = {}
    for task, metrics in sorted(report.get("results", {}).items()):
        scores[task] = {key.split(",")[0]: value for key, value in metrics.items()
                        if "," in key and "_stderr" not in key and isinstance(value, int | float)}
    return scores
