"""bench/fleet.py --profile: a sampling profiler inside the console process (a thread reading
sys._current_frames(), started by a generated sitecustomize.py), and the tables of where its threads spent their
time, per phase of a run."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from bench.harness import print_table

ROOT = Path(__file__).resolve().parents[1]
PROFILE_ENV = "MODELGRID_FLEET_PROFILE"
PROFILE_WRITE_S = 2.0  # how stale a phase boundary in the profile may be


# Leaf Python frames of a thread that waits for work. With uvloop the event loop itself is C, so an idle loop's
# leaf is asyncio's Runner.run; a thread pool's idle worker waits in _worker.
IDLE_LEAVES = {("selectors.py", "select"), ("thread.py", "_worker"), ("threading.py", "wait"),
               ("runners.py", "run"), ("queues.py", "get"), ("threading.py", "_wait_for_tstate_lock")}


def start_sampler(out: str, interval: float = 0.01) -> None:
    """In the console process (from the generated sitecustomize): sample every thread's Python stack every
    `interval` s and write the counts of busy stacks to `out` every PROFILE_WRITE_S (os._exit at shutdown
    skips atexit, so the file is kept current instead)."""
    threading.Thread(target=_sample_forever, args=(out, interval), daemon=True, name="fleet-sampler").start()


def _sample_forever(out: str, interval: float) -> None:
    me = threading.get_ident()
    names = {}
    stacks: collections.Counter[str] = collections.Counter()
    busy: collections.Counter[str] = collections.Counter()
    ticks = 0
    written = time.monotonic()
    while True:
        time.sleep(interval)
        ticks += 1
        if ticks % 100 == 1:
            names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            code = frame.f_code
            if (Path(code.co_filename).name, code.co_name) in IDLE_LEAVES:
                continue
            parts = []
            while frame is not None:
                parts.append(f"{_short(frame.f_code.co_filename)}:{frame.f_code.co_name}")
                frame = frame.f_back
            thread = names.get(ident, str(ident)).replace("MainThread", "main (event loop)")
            busy[thread] += 1
            stacks[thread + ";" + ";".join(reversed(parts))] += 1
        if time.monotonic() - written > PROFILE_WRITE_S:
            written = time.monotonic()
            with open(out + ".tmp", "w") as f:
                json.dump({"interval": interval, "ticks": ticks, "busy": busy, "stacks": stacks}, f)
            os.replace(out + ".tmp", out)


def _short(filename: str) -> str:
    for marker in ("/site-packages/", f"{ROOT}/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def profile_env(tmp: Path, out: Path) -> dict:
    """Environment that makes `manage.py up` start the sampler (and only `up`, not `manage.py shell`)."""
    site = tmp / "profile-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"if os.environ.get({PROFILE_ENV!r}) and 'up' in sys.argv:\n"
        "    import bench.fleet_profile\n"
        f"    bench.fleet_profile.start_sampler(os.environ[{PROFILE_ENV!r}])\n")
    return {"PYTHONPATH": f"{site}:{ROOT}", PROFILE_ENV: str(out)}


def read_profile(path: Path | None) -> dict | None:
    """The sampler's latest counts (written every 5 s), or None."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text()) if path is not None else None
    return None


def profile_between(before: dict | None, after: dict | None) -> dict | None:
    """The samples taken between two readings of the profile file."""
    if after is None:
        return None
    before = before or {"ticks": 0, "busy": {}, "stacks": {}}
    diff = {k: collections.Counter(after[k]) - collections.Counter(before[k]) for k in ("busy", "stacks")}
    return {"interval": after["interval"], "ticks": after["ticks"] - before["ticks"], **diff}


def print_profile(data: dict | None, title: str, top: int = 20) -> None:
    if not data or not data["ticks"]:
        print(f"\n({title}: no profile samples)")
        return
    seconds = data["ticks"] * data["interval"]
    rows = [{"thread": t, "busy samples": n, "busy % of wall": 100 * n / data["ticks"]}
            for t, n in sorted(data["busy"].items(), key=lambda kv: -kv[1])[:8]]
    print_table(f"{title}: busy samples per console thread over {seconds:.0f} s", rows,
                ("ThreadPoolExecutor-0_0 is (normally) the one thread Channels runs every database_sync_to_async "
                 "call in (thread_sensitive). 'Busy' is wall time with Python frames on the stack beyond an idle "
                 "wait: it includes waiting for PostgreSQL inside psycopg and waiting for the GIL.",))
    inclusive: collections.Counter[str] = collections.Counter()
    entry: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for stack, n in data["stacks"].items():
        thread, *frames = stack.split(";")
        total += n
        ours = [f for f in frames if f.startswith(("console/", "agent/"))]
        for f in set(ours):
            inclusive[f] += n
        if ours:
            entry[f"{thread}: {ours[0]}"] += n
        leaf[frames[-1] if frames else "?"] += n
    for name, counter in (("entry point (first project frame)", entry), ("inclusive, project functions", inclusive),
                          ("self (leaf frame)", leaf)):
        rows = [{"where": k, "samples": n, "% of busy": 100 * n / max(total, 1)}
                for k, n in counter.most_common(top)]
        print_table(f"{title}: {name}", rows)
