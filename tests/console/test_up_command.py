import socket
import subprocess
import sys
from pathlib import Path

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


def test_the_console_socket_is_tcp_so_small_answers_are_not_held_back_by_nagle():
    import socket

    from console.deployments.management.commands.up import _listen

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
from console.deployments.management.commands.up import _ExitDeadline

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
    from console.deployments.management.commands import up

    # SIGTERM to exit: the agent's stop (the longest part) plus the scheduler's and the interpreter's grace
    # must end before the hard deadline, and that before the 10 s promised in docs/operations.md.
    assert up.SERVER_DRAIN_TIMEOUT < up.AGENT_STOP_TIMEOUT
    assert up.AGENT_STOP_TIMEOUT + 2 * up.SCHEDULER_STOP_TIMEOUT + up.EXIT_GRACE < up.SHUTDOWN_DEADLINE < 10
