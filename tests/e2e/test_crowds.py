"""A crowd of idle connections against a running console (`manage.py up`): 20,000 of them exhausted its
descriptors (every request failed for 40 s and SQLite could not open its files); bounded, it keeps answering."""

from __future__ import annotations

import select
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import pytest

pytestmark = pytest.mark.e2e

# Opens N connections that never send a byte, says how many it holds, and keeps them until its stdin closes.
CROWD = """
import socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(count):
    try:
        held.append(socket.create_connection((host, port), timeout=30))
    except OSError:
        pass
print(len(held), flush=True)
sys.stdin.read()
"""
CROWD_SIZE = 20_000
PER_PROCESS = 10_000  # each process holds half: one process may open 20,000 descriptors in all here


def test_twenty_thousand_idle_connections_leave_the_console_answering(stack):
    where = urlsplit(stack.url)
    crowds = [subprocess.Popen([sys.executable, "-c", CROWD, where.hostname, str(where.port), str(PER_PROCESS)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for _ in range(CROWD_SIZE // PER_PROCESS)]
    try:
        held = 0
        for crowd in crowds:
            ready, _, _ = select.select([crowd.stdout], [], [], 240)
            assert ready, "the crowd did not finish connecting within 240 s"
            held += int(crowd.stdout.readline())
        assert held == CROWD_SIZE  # every one was accepted (the oldest idle ones closed to make room)
        with httpx.Client(base_url=stack.url.rstrip("/"), timeout=30,
                          headers={"Authorization": f"Bearer {stack.token}"}) as client:
            for path in ("/api/v1/hosts", "/v1/models", "/api/v1/deployments"):
                assert client.get(path).status_code == 200, path
        assert stack.proc.poll() is None
    finally:
        for crowd in crowds:
            crowd.kill()
            crowd.wait(30)
