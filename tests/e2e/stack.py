"""Start `manage.py up` as a real process on a free loopback port, with its own data dir and
(on the PostgreSQL pass) its own database and Redis prefix."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "e2e-" + secrets.token_urlsafe(12)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Stack:
    proc: subprocess.Popen
    url: str
    env: dict
    data_dir: Path
    lines: list[str] = field(default_factory=list)
    token: str = ""
    admin_token: str = ""

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url + "api/v1", headers={"Authorization": f"Bearer {token or self.token}"},
                            timeout=30)

    def admin_api(self) -> httpx.Client:
        """`api` as the stack's admin (a staff user): for what binds every team (hosts, strategy, alert rules)."""
        if not self.admin_token:
            self.admin_token = self.manage("createapitoken", "admin", "--name", "e2e-admin")
        return self.api(self.admin_token)

    def gateway(self, token: str | None = None) -> httpx.Client:
        """A client of the console's inference gateway (/v1, /v2) with a bearer token."""
        return httpx.Client(base_url=self.url.rstrip("/"), timeout=120,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    def manage(self, *args: str) -> str:
        run = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                             text=True, timeout=60, check=True)
        return run.stdout.strip()

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def worker_pids(self, deployment: str) -> set[int]:
        """The live worker processes of a deployment's replicas, by the pids the agent reports.
        (Not every spawned child: the agent also keeps warm spare workers, which serve no replica.)"""
        r = self.api().get(f"/deployments/{deployment}")
        replicas = r.json()["replicas"] if r.status_code == 200 else []
        return {r["pid"] for r in replicas if r["pid"] and alive(r["pid"])}

    def stop(self, timeout: float = 40) -> int:
        family = self.descendants()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        _, alive = psutil.wait_procs(family, timeout=10)
        for p in alive:
            p.kill()
        self.leftovers = [p.pid for p in alive]
        return code


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _database_env() -> tuple[dict, callable]:
    """On the PostgreSQL pass, a fresh database for this stack; dropped by the returned cleanup."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        return {}, lambda: None
    import psycopg

    name = f"modelgrid_e2e_{os.getpid()}_{secrets.token_hex(3)}"
    base = url.rsplit("/", 1)[0]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return {"DATABASE_URL": f"{base}/{name}", "MODELGRID_CHANNEL_PREFIX": name}, drop


def start(
    data_dir: Path, gpus: str = "sim:2x24GiB", timeout: float = 120, args: tuple[str, ...] = (), **env_overrides: str
) -> tuple[Stack, callable]:
    db_env, drop_db = _database_env()
    env = os.environ | db_env | {
        "MODELGRID_DATA_DIR": str(data_dir),
        "MODELGRID_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MODELGRID_SCHEDULER_INTERVAL": "0.2",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    } | env_overrides
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--host", "127.0.0.1", "--port", str(port), "--gpus", gpus, *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    stack = Stack(proc=proc, url="", env=env, data_dir=data_dir)
    ready = threading.Event()

    def pump():  # keep reading so the child never blocks on a full pipe
        for line in proc.stdout:
            stack.lines.append(line)
            if line.startswith("ModelGrid console: "):
                stack.url = line.split(": ", 1)[1].strip()
                ready.set()
        ready.set()  # the process ended: no need to wait out the timeout

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout) or not stack.url:
        why = (f"exited with code {proc.poll()} before it was ready" if proc.poll() is not None
               else f"did not start within {timeout:.0f} s")
        proc.kill()
        drop_db()
        raise RuntimeError(f"manage.py up {why}:\n" + "".join(stack.lines[-40:]))
    stack.token = stack.manage("createapitoken", "e2e")
    return stack, drop_db


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; bounded by `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def remove(api, deployments: tuple[str, ...] = (), models: tuple[str, ...] = ()) -> None:
    """Delete what a test made on a shared stack, its deployments and then its models, so that a later test finds
    the model store as it was (the dashboard's one-click Register of tiny-llama)."""
    for name in deployments:
        api.delete(f"/deployments/{name}")
    for name in models:
        wait_for(lambda name=name: api.delete(f"/models/{name}").status_code in (204, 404), timeout=30,
                 what=f"model {name} to be deleted")


def launch(args: list[str], env: dict, ready_line: str, timeout: float = 60) -> tuple[subprocess.Popen, list[str]]:
    """A child process whose output is collected line by line; returns once it printed `ready_line`."""
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def pump():  # keep reading so the child never blocks on a full pipe
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        wait_for(lambda: proc.poll() is not None or any(ready_line in line for line in lines), timeout,
                 what=f"{ready_line!r} from {' '.join(args[1:4])}")
    except TimeoutError:
        proc.kill()
        raise
    if proc.poll() is not None:
        raise RuntimeError(f"{' '.join(args[1:4])} exited with {proc.returncode}:\n" + "".join(lines[-40:]))
    return proc, lines


def descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def said(stack_or_lines, text: str) -> bool:
    lines = stack_or_lines.lines if isinstance(stack_or_lines, Stack) else stack_or_lines
    return any(text in line for line in list(lines))


def kill_all(procs, pids=()) -> None:
    """Kill these processes (None entries skipped), their descendants, and other pids: workers an agent
    adopted are not its children, and by design outlive it."""
    family = [c for proc in procs if proc is not None for c in descendants(proc)]
    family += [psutil.Process(pid) for pid in pids if alive(pid)]
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for leftover in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()
