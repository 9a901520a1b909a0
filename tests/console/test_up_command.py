import contextlib
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_busy_port_is_one_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "manage.py", "up", "--no-agent", "--port", str(port), "--data-dir", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={"PATH": "/usr/bin:/bin", "MODELGRID_ADMIN_PASSWORD": "a-long-password"},
        )
    assert run.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_scheduler_process_without_redis_is_one_clear_error(tmp_path):
    """Its pushes and the wake-ups it answers cross processes through the channel layer: the in-memory one (no
    REDIS_URL) is per process, so the fleet would never be placed."""
    run = subprocess.run(
        [sys.executable, "manage.py", "up", "--no-agent", "--scheduler-process", "--port", "0",
         "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "MODELGRID_ADMIN_PASSWORD": "a-long-password"},
    )
    assert run.returncode == 1
    assert "--scheduler-process needs the Redis channel layer (set REDIS_URL)" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_console_socket_is_tcp_so_small_answers_are_not_held_back_by_nagle():
    import socket

    from console.control.management.commands.up import _listen

    sock = _listen("127.0.0.1", 0)
    try:
        # asyncio sets TCP_NODELAY on accepted connections only for a socket created as IPPROTO_TCP.
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


STUCK_THREAD = """
import os, sys, threading
import django
django.setup()
from console.control.management.commands.up import _ExitDeadline

def before_exit():
    print("before exit", flush=True)

# A non-daemon thread that never ends, like a sync view stuck in a database lock: the interpreter would
# join it at exit forever.
threading.Thread(target=threading.Event().wait, daemon=False).start()
_ExitDeadline(before_exit).arm(0.2, 3, "gave up waiting")
print("main thread done", flush=True)
"""


def test_the_exit_deadline_ends_the_process_despite_a_stuck_non_daemon_thread(tmp_path):
    run = subprocess.run([sys.executable, "-c", STUCK_THREAD], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "console.settings",
                              "MODELGRID_DATA_DIR": str(tmp_path)})
    assert run.returncode == 3, run.stderr
    assert run.stdout.splitlines() == ["main thread done", "before exit"]
    assert "gave up waiting" in run.stderr


def test_the_shutdown_budget_fits_in_ten_seconds():
    from console.control.management.commands import up

    # SIGTERM to exit: the agent's stop (the longest part) plus the scheduler's and the interpreter's grace
    # must end before the hard deadline, and that before the 10 s promised in docs/operations.md.
    assert up.SERVER_DRAIN_TIMEOUT < up.AGENT_STOP_TIMEOUT
    assert up.AGENT_STOP_TIMEOUT + 2 * up.SCHEDULER_STOP_TIMEOUT + up.EXIT_GRACE < up.SHUTDOWN_DEADLINE < 10


@pytest.mark.django_db
def test_the_local_agent_keeps_its_token_across_restarts_while_it_still_authenticates(tmp_path):
    from console.control.management.commands.up import LOCAL_AGENT_TOKEN_FILE, local_agent_token
    from console.fleet.models import AgentCredential

    token = local_agent_token("local", tmp_path)
    kept = tmp_path / LOCAL_AGENT_TOKEN_FILE
    assert kept.read_text().strip() == token
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert local_agent_token("local", tmp_path) == token
    assert AgentCredential.authenticate(token).host_name == "local"

    # Rotated by an operator (createagenttoken), or the database was replaced: the kept token no longer
    # authenticates, so a new one is issued and kept.
    AgentCredential.issue("local")
    fresh = local_agent_token("local", tmp_path)
    assert fresh != token and kept.read_text().strip() == fresh
    # Another host's token is never taken for the local agent's.
    other = AgentCredential.issue("gpu-1")[1]
    kept.write_text(other)
    assert local_agent_token("local", tmp_path) not in (other, fresh)
    assert AgentCredential.authenticate(other).host_name == "gpu-1"


def start_up(data_dir, port: int) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--data-dir", str(data_dir), "--gpus", "sim:1x1GiB"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={"PATH": "/usr/bin:/bin", "MODELGRID_ADMIN_PASSWORD": "a-long-password", "PYTHONUNBUFFERED": "1",
             "HF_HUB_OFFLINE": "1"},
    )
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def local_agent(up: subprocess.Popen) -> psutil.Process | None:
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(up.pid).children():
            if "agent" in child.cmdline() and "run" in child.cmdline():
                return child
    return None


def test_the_local_agent_dies_with_up_even_on_sigkill_and_the_next_up_links_it_with_the_kept_token(tmp_path):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    up, lines = start_up(tmp_path, number)
    family: list[psutil.Process] = []
    try:
        agent = wait_until(lambda: local_agent(up), 60, "the local agent to start")
        wait_until(lambda: any("connected to the console" in line for line in lines), 60, "the agent to link")
        token = (tmp_path / "local-agent.token").read_text()
        family = [agent, *agent.children(recursive=True)]
        up.kill()  # SIGKILL: `up` runs no cleanup at all
        up.wait(10)
        _, alive = psutil.wait_procs(family, timeout=15)
        assert alive == [], f"orphans outlived `up`: {[p.cmdline() for p in alive]}"

        up, lines = start_up(tmp_path, number)
        wait_until(lambda: any("connected to the console" in line for line in lines), 60, "the agent to link again")
        assert (tmp_path / "local-agent.token").read_text() == token
        assert not any("refused the agent token" in line for line in lines)
        up.send_signal(signal.SIGINT)
        assert up.wait(15) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        for p in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
