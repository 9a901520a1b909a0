"""More than one console, as scaled out: two `manage.py up --no-agent` on one PostgreSQL database and one Redis
channel layer, a real agent linked to one of them. Exactly one leads the scheduler; when it is killed the other
leads, no replica restarts, and the agent's link (on the Redis layer) stays up throughout."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.stack import (
    ADMIN_PASSWORD,
    Stack,
    _database_env,
    alive,
    free_port,
    kill_all,
    launch,
    said,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.db_stack]

LINK_HELD_SECONDS = 60


def redis_or_skip() -> None:
    """Skip, saying why, unless a Redis is configured (REDIS_URL) and answers."""
    url = os.environ.get("REDIS_URL", "")
    if not url:
        pytest.skip("needs Redis: REDIS_URL is not set (the consoles share one channel layer)")
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=3).ping()
    except redis.RedisError as e:
        pytest.skip(f"needs Redis: {url} does not answer ({e})")


def services_or_skip() -> None:
    """Skip, naming what is missing, unless PostgreSQL and Redis are configured and answer."""
    database = os.environ.get("DATABASE_URL", "")
    if not database.startswith("postgres"):
        pytest.skip("needs PostgreSQL: DATABASE_URL is not a postgres:// URL (the consoles share one database)")
    import psycopg

    try:
        psycopg.connect(database, connect_timeout=3).close()
    except psycopg.Error as e:
        pytest.skip(f"needs PostgreSQL: {database} does not answer ({e})")
    redis_or_skip()


def test_the_redis_layer_reads_replies_for_longer_than_its_blocking_pop_waits(monkeypatch):
    from console import settings
    from console.realtime.redis_layer import ChannelLayer

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    (host,) = settings._channel_layers()["default"]["CONFIG"]["hosts"]
    # An empty pop answers after brpop_timeout; a read that gives up by then kills the consumer (and its websocket).
    assert host["socket_timeout"] > ChannelLayer.brpop_timeout


async def test_a_redis_layer_receive_outlasts_an_empty_blocking_pop():
    redis_or_skip()
    from django.conf import settings

    from console.realtime.redis_layer import ChannelLayer

    config = settings.CHANNEL_LAYERS["default"]["CONFIG"] | {"prefix": f"test-receive-{os.getpid()}"}
    layer = ChannelLayer(**config)
    inbox = await layer.new_channel()
    receiving = asyncio.create_task(layer.receive(inbox))
    try:
        # Past one empty pop: the receive must still be waiting, not failed with redis's TimeoutError.
        done, _ = await asyncio.wait({receiving}, timeout=ChannelLayer.brpop_timeout + 2)
        assert not done, f"receive ended: {receiving.exception()!r}"
        await layer.send(inbox, {"type": "ping"})
        assert await asyncio.wait_for(receiving, 10) == {"type": "ping"}
    finally:
        receiving.cancel()
        await layer.flush()


def console(env: dict) -> Stack:
    port = free_port()
    proc, lines = launch([sys.executable, "manage.py", "up", "--no-agent", "--port", str(port)], env,
                         "ModelGrid console: ")
    return Stack(proc=proc, url=f"http://127.0.0.1:{port}/", env=env, data_dir=Path(env["MODELGRID_DATA_DIR"]),
                 lines=lines)


def consoles_env(db_env: dict, tiny_llama: Path, tmp_path: Path) -> dict:
    """The environment of consoles sharing one database (`db_env`) and one data dir, and of their agent."""
    return os.environ | db_env | {
        "MODELGRID_DATA_DIR": str(tmp_path / "data"),  # shared: one secret key for both consoles
        "MODELGRID_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MODELGRID_MODEL_ROOTS": str(tiny_llama.parent),
        "MODELGRID_SCHEDULER_INTERVAL": "0.2",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    }


def link_agent(stack: Stack, env: dict) -> tuple[subprocess.Popen, list[str]]:
    """A real agent, host h1 with one simulated GPU, linked to the console `stack`."""
    agent_env = env | {"MODELGRID_AGENT_TOKEN": stack.manage("createagenttoken", "h1")}
    return launch([sys.executable, "-m", "agent", "run", "--console", stack.url.rstrip("/"), "--name", "h1",
                   "--gpus", "sim:1x24GiB", "--warm-workers", "0"], agent_env, "connected to the console at")


def test_when_the_leading_console_is_killed_the_other_leads_and_nothing_restarts_or_reconnects(tiny_llama, tmp_path):
    services_or_skip()
    db_env, drop_db = _database_env()
    env = consoles_env(db_env, tiny_llama, tmp_path)
    began = time.monotonic()
    started: list[subprocess.Popen] = []
    logs: dict[str, list[str]] = {}  # printed at the end: pytest shows them when the test fails
    try:
        first = console(env)  # first alone: it migrates the fresh database and is elected
        started.append(first.proc)
        logs["first console"] = first.lines
        wait_for(lambda: said(first, "leading scheduler (epoch 1)"), 15, what="the first console to lead")
        second = console(env)
        started.append(second.proc)
        logs["second console"] = second.lines
        wait_for(lambda: said(second, "following (leader: "), 15, what="the second console to follow")
        assert not said(second, "leading scheduler")

        second.token = second.manage("createapitoken", "e2e")
        agent, agent_lines = link_agent(second, env)
        started.append(agent)
        logs["agent"] = agent_lines
        linked_at = time.monotonic()
        print(f"two consoles and a linked agent after {linked_at - began:.1f} s")

        # Through the follower's API; the leader (in the other process) places it and pushes the host its
        # desired state through Redis to the follower's end of the agent link.
        api = second.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        assert api.post("/deployments", json={"name": "chat", "model": "tiny", "replicas": 1}).status_code == 201
        wait_for(lambda: api.get("/deployments/chat").json()["state"] == "ready", 120, what="chat to be ready")
        (worker,) = second.worker_pids("chat")
        print(f"chat ready after {time.monotonic() - began:.1f} s")

        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        wait_for(lambda: said(second, "leading scheduler (epoch 2)"), 10, what="the second console to lead")
        print(f"second console leads after {time.monotonic() - began:.1f} s")

        # The new leader's passes keep the replica where it is: same worker, still ready.
        wait_for(lambda: time.monotonic() - linked_at >= LINK_HELD_SECONDS, LINK_HELD_SECONDS + 5, interval=1,
                 what=f"the agent link to be {LINK_HELD_SECONDS} s old")
        d = api.get("/deployments/chat").json()
        assert d["state"] == "ready" and [r["pid"] for r in d["replicas"]] == [worker] and alive(worker)
        assert agent.poll() is None
        connects = [line for line in agent_lines if "connected to the console at" in line]
        drops = [line for line in agent_lines if "reconnecting in" in line or "closed the connection" in line]
        assert len(connects) == 1 and drops == [], "".join(agent_lines[-30:])
    finally:
        # Killed, not stopped: a graceful stop is tested elsewhere and would add seconds here. Their children
        # (the worker; an agent may leave workers for a successor to adopt) are killed too.
        kill_all(started)
        drop_db()
        print(f"test took {time.monotonic() - began:.1f} s")
        for name, lines in logs.items():
            print(f"--- {name}\n" + "".join(lines[-40:]))
