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
