"""Call an artifact reader in a fresh interpreter with a deadline.

A hostile file that makes a reader hang (a FIFO), spin (a loop over 10**15 layers) or backtrack
forever while holding the GIL would hang the whole test run if called in-process; here the child
is killed at the deadline and the test fails with "timeout" instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import importlib, json, sys
module, _, name = sys.argv[1].rpartition(".")
func = getattr(importlib.import_module(module), name)
from agent.artifacts import ArtifactError
try:
    func(*json.loads(sys.argv[2]))
    print("ok")
except ArtifactError as e:
    print(f"ArtifactError: {e}")
except BaseException as e:
    print(f"{type(e).__name__}: {e}")
"""
ROOT = Path(__file__).resolve().parents[3]


def outcome(func: str, *args: object, timeout: float = 60) -> str:
    """'ok', 'ArtifactError: <message>', '<OtherError>: <message>' or 'timeout' for `func(*args)`.

    `func` is a dotted name such as "agent.artifacts.read_adapter_dir"; args must be JSON values.
    """
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", _CHILD, func, json.dumps([str(a) if isinstance(a, Path) else a for a in args])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return "timeout"
    return done.stdout.strip() or f"no output (exit {done.returncode}): {done.stderr[-2000:]}"
