"""Chaos on real processes, in the scaled-out mode (PostgreSQL, a Redis of its own): a console, a separate
agent and a tiny Llama replica, then one fault at a time: the console stopped with SIGTERM under inference
load through the gateway and restarted, the console killed, Redis killed and restarted, a duplicate agent
connection, the agent paused past its lease, the agent killed and restarted, a worker killed.

After each fault: no deployment spec is lost, the replica is ready again, and its worker is the same process
unless the fault killed that worker. Each prints how long the fleet took to converge."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from websockets.sync.client import connect as ws_connect

from agent.protocol import PROTOCOL_VERSION
from tests.e2e.stack import ADMIN_PASSWORD, Stack, _database_env, alive, free_port, kill_all, launch, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.db_stack]
LEASE_S = 3  # short, so that a paused agent lapses within the test
HEARTBEAT_S = 4  # the agent's --heartbeat-timeout: short, so that a pause outlasts it within the test
# What a fault must not bring about for a replica that was fine: nothing moves, stops, or is taken from it.
TAKING = {"Moved", "Stopped", "Preempted", "Slept", "Refused", "HeartbeatTimeout"}


def scaled_out_or_skip() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        pytest.skip("runs in the PostgreSQL + Redis pass (DATABASE_URL is not a postgres:// URL)")
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH (a Redis of its own, to kill and restart)")


@dataclass
class Fleet:
    env: dict
    port: int
    redis_port: int
    state_dir: Path
    agent_token: str = ""
    console: Stack | None = None
    agent: subprocess.Popen | None = None
    agent_lines: list[str] = field(default_factory=list)
    redis: subprocess.Popen | None = None
    spec: list = field(default_factory=list)
    workers: set[int] = field(default_factory=set)  # every worker pid seen, killed at the end

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port), "--save", "", "--appendonly",
             "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        wait_for(lambda: _pings(redis.Redis(port=self.redis_port, socket_timeout=1)), 10, what="redis")

    def start_console(self) -> None:
        proc, lines = launch([sys.executable, "manage.py", "up", "--no-agent", "--port", str(self.port)], self.env,
                             "ModelGrid console: ")
        token = self.console.token if self.console else ""
        self.console = Stack(proc=proc, url=self.url, env=self.env, data_dir=Path(self.env["MODELGRID_DATA_DIR"]),
                             lines=lines, token=token)

    def start_agent(self) -> None:
        self.agent, self.agent_lines = launch(
            [sys.executable, "-m", "agent", "run", "--console", self.url.rstrip("/"), "--name", "h1",
             "--gpus", "sim:1x24GiB", "--warm-workers", "0", "--state-dir", str(self.state_dir),
             "--heartbeat-timeout", str(HEARTBEAT_S)],
            self.env | {"MODELGRID_AGENT_TOKEN": self.agent_token}, "connected to the console at")

    def replica(self) -> dict:
        with contextlib.suppress(Exception):
            (r,) = self.console.api().get("/deployments/chat").json()["replicas"]
            return r
        return {}

    def ready(self) -> dict | None:
        """The replica, once it is ready on a live worker and its host is connected and has applied the
        desired state it was last sent."""
        r = self.replica()
        if not (r.get("state") == "ready" and r.get("pid") and alive(r["pid"])):
            return None
        self.workers.add(r["pid"])
        (h,) = self.console.api().get("/hosts").json()
        return r if h["state"] == "connected" and h["acked_generation"] == h["generation"] else None

    def settled(self) -> dict:
        """The replica once ready (a fault before may still be settling: a push not yet acknowledged)."""
        return wait_for(self.ready, 30, interval=0.2, what="the replica to be ready before the fault")

    def specs(self) -> list:
        return [{k: d[k] for k in ("name", "model", "min_replicas", "max_replicas", "priority")}
                for d in self.console.api().get("/deployments").json()]

    def converged(self, began: float, what: str, timeout: float = 60) -> dict:
        r = wait_for(self.ready, timeout, interval=0.2, what=f"the replica to be ready again after {what}")
        print(f"{what}: converged in {time.monotonic() - began:.1f} s")
        assert self.specs() == self.spec  # nothing of what the operator asked for was lost
        return r

    def host_state(self) -> str:
        (h,) = self.console.api().get("/hosts").json()
        return h["state"]

    def taken_since(self, since: float) -> list[str]:
        """Events since `since` (unix time) that took something from the deployment's replicas."""
        events = self.console.api().get("/events", params={"object": "deployment/chat", "since": f"{since:.3f}",
                                                            "limit": 500}).json()["events"]
        return [f"{e['reason']}: {e['message']}" for e in events if e["reason"] in TAKING]


def _pings(client) -> bool:
    try:
        return client.ping()
    except Exception:
        return False


@pytest.fixture(scope="module")
def fleet(tiny_llama, tmp_path_factory):
    scaled_out_or_skip()
    data = tmp_path_factory.mktemp("chaos")
    db_env, drop_db = _database_env()
    redis_port = free_port()
    env = os.environ | db_env | {
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "MODELGRID_DATA_DIR": str(data / "data"),
        "MODELGRID_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MODELGRID_MODEL_ROOTS": str(tiny_llama.parent),
        "MODELGRID_SCHEDULER_INTERVAL": "0.2",
        "MODELGRID_HOST_LEASE_SECONDS": str(LEASE_S),
        "MODELGRID_RECONNECT_GRACE_SECONDS": "5",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    }
    fleet = Fleet(env=env, port=free_port(), redis_port=redis_port, state_dir=data / "agent-state")
    try:
        fleet.start_redis()
        fleet.start_console()
        fleet.console.token = fleet.console.manage("createapitoken", "chaos")
        fleet.agent_token = fleet.console.manage("createagenttoken", "h1")
        fleet.start_agent()
        api = fleet.console.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        assert api.post("/deployments", json={"name": "chat", "model": "tiny", "replicas": 1}).status_code == 201
        wait_for(fleet.ready, 120, what="chat to be ready")
        fleet.spec = fleet.specs()
        yield fleet
    finally:
        kill_all([fleet.console and fleet.console.proc, fleet.agent, fleet.redis], fleet.workers)
        drop_db()


def completions_under_load(fleet: Fleet, stop: threading.Event, failures: list, done: list, retries: int = 6) -> None:
    # The official client, with its own retries: a request that met a closed port while the console restarted
    # is retried, as any client of a service behind a restart would (none in a scale-down: nothing restarts).
    client = openai.OpenAI(base_url=fleet.url + "v1", api_key=fleet.console.token, max_retries=retries, timeout=60)
    while not stop.is_set():
        try:
            client.completions.create(model="chat", prompt="hello", max_tokens=2)
            done.append(1)
        except Exception as e:
            failures.append(repr(e))


@contextlib.contextmanager
def under_load(fleet: Fleet, clients: int, retries: int = 6):
    """`clients` threads sending completions until the block ends; yields (failures, done), both lists."""
    stop, failures, done = threading.Event(), [], []
    threads = [threading.Thread(target=completions_under_load, args=(fleet, stop, failures, done, retries))
               for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(done) >= 2 * clients, 30, what="requests to flow")
        yield failures, done
    finally:
        stop.set()
        for t in threads:
            t.join(90)


def flowing(done: list, what: str, more: int = 8) -> None:
    before = len(done)
    wait_for(lambda: len(done) >= before + more, 60, what=f"requests to flow {what}")


def test_a_console_restart_under_load_fails_no_request_and_restarts_no_worker(fleet):
    pid = fleet.settled()["pid"]
    since = time.time()
    with under_load(fleet, 4) as (failures, done):
        began = time.monotonic()
        fleet.console.proc.send_signal(signal.SIGTERM)
        assert fleet.console.proc.wait(15) == 0
        fleet.start_console()
        flowing(done, "through the restarted console")
        print(f"console SIGTERM restart: requests flow again after {time.monotonic() - began:.1f} s")
    assert failures == []
    assert fleet.converged(began, "console SIGTERM restart")["pid"] == pid
    assert fleet.taken_since(since) == []


def test_a_killed_console_moves_nothing(fleet):
    pid = fleet.settled()["pid"]
    since, began = time.time(), time.monotonic()
    fleet.console.proc.kill()
    fleet.console.proc.wait(10)
    time.sleep(LEASE_S + 1)  # down for longer than a lease
    fleet.start_console()
    assert fleet.converged(began, "console kill -9")["pid"] == pid
    assert fleet.taken_since(since) == []


def test_a_redis_restart_drops_nothing(fleet):
    pid = fleet.settled()["pid"]
    began = time.monotonic()
    fleet.redis.kill()
    fleet.redis.wait(10)
    time.sleep(1)
    fleet.start_redis()
    # The links resync through the fresh Redis: a change made now still reaches the agent.
    assert fleet.console.api().patch("/deployments/chat", json={"priority": "high"}).status_code == 200
    fleet.spec = fleet.specs()
    assert fleet.converged(began, "redis kill -9 and restart")["pid"] == pid
    wait_for(lambda: fleet.host_state() == "connected", 30, what="the host to be connected")


def test_a_duplicate_agent_connection_takes_nothing_down(fleet):
    pid = fleet.settled()["pid"]
    began = time.monotonic()
    headers = {"Authorization": f"Bearer {fleet.agent_token}"}
    # A second copy of the agent (a stale process, a copied token): it says hello with the host's own GPUs.
    (host,) = fleet.console.api().get("/hosts").json()
    gpus = [{k: g[k] for k in ("index", "uuid", "name", "total_bytes", "used_bytes", "simulated")}
            for g in host["gpus"]]
    hello = {"type": "hello", "protocol": PROTOCOL_VERSION, "host": "h1", "agent_version": "duplicate",
             "endpoint": host["endpoint"], "gpus": gpus}
    with ws_connect(fleet.url.replace("http", "ws") + "ws/agent/", additional_headers=headers) as duplicate:
        duplicate.send(json.dumps(hello))
        assert json.loads(duplicate.recv(timeout=10))["type"] == "desired_state"
    # Its link superseded the real agent's, which reconnects and takes the host back.
    assert fleet.converged(began, "a duplicate agent connection")["pid"] == pid
    wait_for(lambda: fleet.host_state() == "connected", 30, what="the host to be connected")
    assert fleet.ready()["pid"] == pid


def test_an_agent_paused_past_its_lease_is_unknown_and_comes_back_without_moving(fleet):
    """Paused past its lease and its workers' heartbeat timeout, under load: the agent does not blame its worker for
    its own silence, nothing is taken from the unknown host, and the requests sent meanwhile are answered."""
    pid = fleet.settled()["pid"]
    with under_load(fleet, 2) as (failures, done):
        since, began = time.time(), time.monotonic()
        fleet.agent.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: fleet.host_state() == "unknown", LEASE_S + 10, interval=0.5,
                     what="the host to be unknown")
            print(f"paused agent: unknown after {time.monotonic() - began:.1f} s")
            time.sleep(2 * HEARTBEAT_S)  # paused well past the heartbeat timeout too
            assert fleet.replica()["host"] == "h1"  # kept: unknown is not gone
        finally:
            fleet.agent.send_signal(signal.SIGCONT)
        wait_for(lambda: fleet.host_state() == "connected", 30, interval=0.5, what="the host to be connected again")
        flowing(done, "again", 4)
    assert fleet.converged(began, "agent paused past its lease")["pid"] == pid
    assert failures == [] and fleet.taken_since(since) == []


def test_a_scale_down_under_load_drains_and_fails_no_request(fleet):
    fleet.settled()
    api = fleet.console.api()
    assert api.patch("/deployments/chat", json={"min_replicas": 2, "max_replicas": 2}).status_code == 200
    wait_for(lambda: [r["state"] for r in api.get("/deployments/chat").json()["replicas"]] == ["ready"] * 2, 120,
             interval=0.5, what="two replicas ready")
    with under_load(fleet, 4, retries=0) as (failures, done):  # no retries: nothing restarts
        assert api.patch("/deployments/chat", json={"min_replicas": 1, "max_replicas": 1}).status_code == 200
        wait_for(lambda: len(api.get("/deployments/chat").json()["replicas"]) == 1, 60, interval=0.2,
                 what="the scale-down")
        flowing(done, "after it")
    fleet.spec = fleet.specs()
    assert failures == []  # the leaving replica finished what it had; the gateway sent the rest to the other


def test_a_killed_agent_is_replaced_and_adopts_the_worker(fleet):
    pid = fleet.settled()["pid"]
    began = time.monotonic()
    fleet.agent.kill()
    fleet.agent.wait(10)
    assert alive(pid)  # the worker outlives its agent, model loaded
    fleet.start_agent()
    assert fleet.converged(began, "agent kill -9 and restart")["pid"] == pid


def test_a_killed_worker_is_restarted(fleet):
    pid = fleet.settled()["pid"]
    began = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    new = wait_for(lambda: (r := fleet.ready()) and r["pid"] != pid and r, 90, interval=0.2,
                   what="a new worker")
    print(f"worker kill -9: a new worker ready after {time.monotonic() - began:.1f} s")
    assert fleet.specs() == fleet.spec and new["host"] == "h1"
