"""`up --no-migrate`: where several consoles share one database, `migrate` runs once before them (a Helm hook Job,
a compose one-shot service); each console refuses a database that is not migrated instead of racing to migrate it."""

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env(data: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return keep | {"MODELGRID_DATA_DIR": str(data), "MODELGRID_ADMIN_PASSWORD": "a-long-password"}


def test_it_refuses_a_database_not_migrated_and_serves_one_that_is(tmp_path):
    up = [sys.executable, "manage.py", "up", "--no-agent", "--no-migrate", "--port", "0"]
    refused = subprocess.run(up, cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert "the database is not migrated (" in refused.stderr and "run `manage.py migrate` once" in refused.stderr
    assert "Traceback" not in refused.stderr

    migrated = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env(tmp_path),
                              capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    proc = subprocess.Popen(up, cwd=ROOT, env=env(tmp_path), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert select.select([proc.stdout], [], [], 60)[0], "no output within 60 s"
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[0].startswith("Admin account: admin") and lines[1].startswith("ModelGrid console: http://"), lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
