"""A daemon that keeps itself private: its environment (the agent's token, in `manage.py up` the console's secrets)
cannot be read through /proc by another process of its user, as an engine is. Checked with two unprivileged
processes of one user, so it runs where the tests run as root (CI), with the system's Python (the tests' own lies
under /root, which that user cannot read)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
PYTHON = "/usr/bin/python3"
pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0 or not os.access(PYTHON, os.X_OK),
                                reason="needs Linux, root and a system Python, to run two processes as one user")

DAEMON = """
import sys, time
from agent.privacy import keep_private
if sys.argv[1] == "private":
    assert keep_private()
print("ready", flush=True)
time.sleep(60)
"""


def _as_nobody() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _read_as_nobody(how: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "MODELGRID_AGENT_TOKEN": "mg_agent_secret"}
    daemon = subprocess.Popen([PYTHON, "-c", DAEMON, how], env=env, stdout=subprocess.PIPE, text=True,
                              preexec_fn=_as_nobody, cwd="/")
    try:
        assert daemon.stdout.readline().strip() == "ready"
        reader = subprocess.run(["cat", f"/proc/{daemon.pid}/environ"], capture_output=True, timeout=30,
                                preexec_fn=_as_nobody, cwd="/", env={"PATH": "/usr/bin:/bin"})
        return "read" if b"mg_agent_secret" in reader.stdout else "refused"
    finally:
        daemon.kill()
        daemon.wait()


def test_a_private_daemons_environment_is_not_readable_by_another_process_of_its_user():
    assert _read_as_nobody("open") == "read"  # what an engine could do before
    assert _read_as_nobody("private") == "refused"
