"""bench/generation.py's health section: an agent's GET /v2/health/live latency, idle and while a large v2
request runs. The probes run in their own process (bench/health_probe.py), so that reading the large answer here
does not delay them (torch-free)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import numpy as np

from bench.harness import percentile, say
from tests.e2e.stack import ROOT

HEALTH_SHAPE = (64, 256)  # rows x tokens of the v2 request (tiny-llama's positions: 256)
TARGET_HEALTH_P99_MS = 100.0


def health(agent: str, secret: str, model: str, args) -> tuple[list[dict], list[str]]:
    """Probe `agent`'s liveness while idle, then during each big v2 request to `model`: a row per window, and a
    note per request (its status, size and time)."""
    rows_n, cols = HEALTH_SHAPE
    ids = np.random.default_rng(0).integers(3, 1024, size=rows_n * cols).tolist()
    body = {"inputs": [{"name": "input_ids", "shape": [rows_n, cols], "datatype": "INT64", "data": ids}]}
    probe = subprocess.Popen([sys.executable, str(ROOT / "bench" / "health_probe.py"), agent + "/v2/health/live",
                              "--interval", str(args.probe_interval)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    windows: list[tuple[str, float, float]] = []
    notes = []
    try:
        if probe.stdout.readline().strip() != "ready":
            raise RuntimeError("bench/health_probe.py did not start (its error is above)")
        began = time.monotonic()
        time.sleep(args.idle_seconds)
        windows.append(("idle", began, time.monotonic()))
        for run in range(args.health_runs):
            say(f"health: [{rows_n}, {cols}] v2 infer on {model}, run {run + 1}/{args.health_runs}")
            began = time.monotonic()
            status, size = _big_request(f"{agent}/v2/models/{model}/infer", secret, body)
            ended = time.monotonic()
            windows.append((f"during [{rows_n}, {cols}] v2 infer, run {run + 1}", began, ended))
            notes.append(f"run {run + 1}: HTTP {status}, {size / 1e6:.1f} MB of JSON read in {ended - began:.1f} s")
    finally:
        out, _ = probe.communicate("stop\n", timeout=60)
    samples = json.loads(out.strip().splitlines()[-1])
    rows = []
    for label, start, end in windows:
        lat = [s[1] * 1e3 for s in samples if start <= s[0] <= end and s[2] == 200]
        failed = sum(1 for s in samples if start <= s[0] <= end and s[2] != 200)
        p99 = percentile(lat, 0.99)
        rows.append({"while": label, "probes": len(lat), "failed": failed, "p50 ms": percentile(lat, 0.5),
                     "p99 ms": p99, "max ms": max(lat, default=float("nan")),
                     "target p99": f"<= {TARGET_HEALTH_P99_MS:g}",
                     "met": ("yes" if p99 <= TARGET_HEALTH_P99_MS else "NO") if label != "idle" else ""})
    return rows, notes


def _big_request(url: str, secret: str, body: dict) -> tuple[int, int]:
    """Send one v2 request and read its answer to the end, discarding it; (status, bytes)."""
    size = 0
    with httpx.Client(timeout=600) as http, http.stream("POST", url, json=body,
                                                        headers={"Authorization": f"Bearer {secret}"}) as r:
        for piece in r.iter_raw():
            size += len(piece)
        return r.status_code, size
