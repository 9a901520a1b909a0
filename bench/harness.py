"""What every benchmark shares: its argument parser, the machine line above its tables, timing, percentiles,
markdown tables, progress lines, and a running `manage.py up` with REST helpers to register and deploy models on
it (tests/e2e/stack.py starts it). tests/bench/test_one_harness.py keeps each of these here and only here."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import httpx
import psutil

from tests.e2e.stack import Stack, start

START_TIMEOUT_S = 180.0


# -- the command line ----------------------------------------------------------------------------------------


def command_line(doc: str, quick: str | None = None, whole_doc: bool = False) -> argparse.ArgumentParser:
    """The benchmark's parser: its docstring's first paragraph as the description (all of it, as written, with
    `whole_doc`), and `--quick` (a smoke run, not figures) where `quick` says what it shortens."""
    made = (argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
            if whole_doc else argparse.ArgumentParser(description=doc.split("\n\n")[0]))
    if quick is not None:
        made.add_argument("--quick", action="store_true", help=quick)
    return made


# -- output --------------------------------------------------------------------------------------------------


def print_table(title: str | None, rows: Sequence[dict | Sequence], notes: tuple[str, ...] = (),
                columns: Sequence[str] | None = None) -> None:
    """A markdown table under `## title` (no heading for None). Rows are dicts (their keys, in first-seen order,
    are the columns) or, with `columns`, sequences: the way to name two columns alike."""
    if title is not None:
        print(f"\n## {title}\n")
    if not rows:
        print("(no rows)")
    else:
        if columns is None:
            columns = list(dict.fromkeys(key for row in rows for key in row))
            rows = [[row.get(c) for c in columns] for row in rows]
        cells = [[_cell(v) for v in row] for row in rows]
        # two characters at least: a markdown delimiter cell needs a hyphen before its colon
        widths = [max(2, len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        print("| " + " | ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)) + " |")
        print("| " + " | ".join("-" * (w - 1) + ":" for w in widths) + " |")
        for r in cells:
            print("| " + " | ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) + " |")
    for note in notes:
        print(f"\n{note}")
    sys.stdout.flush()


def _cell(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return "" if value is None else str(value)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def timings(work: Callable[[], object], runs: int) -> list[float]:
    """Seconds each of `runs` calls of `work` took."""
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        work()
        took.append(time.perf_counter() - began)
    return took


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (a value some request really had); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- the machine ---------------------------------------------------------------------------------------------

CALIBRATION = [{"id": i, "deployment": f"fleet-{i:05d}", "state": "ready", "gpus": [i % 8], "bytes": i << 20}
               for i in range(100)]


def python_speed(repeats: int = 15) -> float:
    """Milliseconds this machine takes for a fixed piece of the interpreter work a console does (JSON both ways,
    dicts, a loop), the median of `repeats`: the same code measured on two days differs as much as its machine
    did. (A 1,000-host run that took 6 s to create its deployments on one day took 14-23 s on another with the
    same code, and this figure, sampled for a minute, sat at 22-25 ms most of the time and at 12-13 ms now and
    then: tables are comparable only beside it.)"""
    took = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(50):
            rows = json.loads(json.dumps(CALIBRATION))
            by_id = {r["id"]: r for r in rows if r["state"] == "ready"}
            total = 0
            for r in by_id.values():
                for g in r["gpus"]:
                    total += r["bytes"] // (g + 1)
        took.append(time.perf_counter() - began)
    return 1000 * statistics.median(took)


def print_header(*facts: str) -> None:
    """The lines above a benchmark's tables: the command that made them, the machine (cores, Python, this
    minute's python_speed: tables are comparable only beside it), then the benchmark's own facts, a line each."""
    print(f"command: .venv/bin/python bench/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}, python_speed {python_speed():.1f} ms "
          "(bench/harness.py; lower is a faster machine)")
    for fact in facts:
        print(fact)
    sys.stdout.flush()


def cpu_seconds(processes: Iterable[int | psutil.Process]) -> float:
    """User + system CPU seconds these processes (pids or psutil's) have used so far; one that is gone counts 0."""
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = (process if isinstance(process, psutil.Process) else psutil.Process(process)).cpu_times()
            total += times.user + times.system
    return total


def cpu_steal() -> float | None:
    """CPU seconds the hypervisor gave other guests (all cores) so far; None where the OS does not say."""
    return getattr(psutil.cpu_times(), "steal", None)


# -- the stack -----------------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1,
               stack: Stack | None = None):
    """Poll `predicate` until it returns something truthy; a TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stack is not None and stack.proc.poll() is not None:
            raise RuntimeError(f"manage.py up exited (code {stack.proc.returncode}) while waiting for {what}:\n"
                               + "".join(stack.lines[-40:]))
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


CONSOLE_SCHEDULER_INTERVAL = "5"  # console/settings.py's default (tests/e2e/stack.py sets a faster one for tests)


@contextlib.contextmanager
def running_stack(data_dir: Path, gpus: str, args: tuple[str, ...] = (), **env: str) -> Iterator[Stack]:
    """tests/e2e/stack.py's `manage.py up` (free loopback port, own data dir, an API token) at the default
    scheduler interval, reading artifacts from the benchmark's temporary directory (the data dir's parent);
    stopped on the way out, whatever happened."""
    began = time.monotonic()
    say(f"starting: manage.py up --gpus {gpus} {' '.join(args)}")
    stack, drop_db = start(data_dir, gpus, timeout=START_TIMEOUT_S, args=args,
                           **({"MODELGRID_SCHEDULER_INTERVAL": CONSOLE_SCHEDULER_INTERVAL,
                               "MODELGRID_MODEL_ROOTS": str(data_dir.parent)} | env))
    say(f"up at {stack.url} in {time.monotonic() - began:.1f} s")
    try:
        yield stack
    finally:
        code = stack.stop()
        drop_db()
        left = getattr(stack, "leftovers", [])
        say(f"stopped manage.py up (exit code {code})" + (f"; killed leftover pids {left}" if left else ""))


def gateway_secret(stack: Stack, host: str = "local") -> str:
    code = ("from console.fleet.models import AgentCredential; "
            f"print(AgentCredential.objects.get(host_name={host!r}).gateway_secret)")
    return stack.manage("shell", "-c", code).splitlines()[-1].strip()


def deployment(api: httpx.Client, name: str) -> dict:
    r = api.get(f"/deployments/{name}")
    r.raise_for_status()
    return r.json()


def replica(api: httpx.Client, name: str) -> dict | None:
    reps = deployment(api, name)["replicas"]
    return reps[0] if reps else None


def ready_replica(api: httpx.Client, name: str) -> dict | None:
    return next((r for r in deployment(api, name)["replicas"] if r["state"] == "ready"), None)


def register(api: httpx.Client, name: str, path: Path) -> None:
    r = api.post("/models", json={"name": name, "path": str(path)})
    if r.status_code != 201:
        raise RuntimeError(f"POST /models {name}: {r.status_code} {r.text}")


def deploy(api: httpx.Client, name: str, model: str, **fields) -> None:
    r = api.post("/deployments", json={"name": name, "model": model} | fields)
    if r.status_code != 201:
        raise RuntimeError(f"POST /deployments {name}: {r.status_code} {r.text}")
