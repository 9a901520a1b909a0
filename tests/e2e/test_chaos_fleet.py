"""Chaos on the fleet simulator (bench/fleet_sim.py), in the scaled-out mode (PostgreSQL, a Redis of its own): one
real console (`manage.py up --no-agent`) and 20 simulated hosts of 2 to 8 GPUs that speak the real agent protocol
from this process, running 40 replicas of five deployments; then one fault at a time: the console killed and
restarted, the console stopped with SIGTERM and restarted, a duplicate agent connection, an agent muted past its
lease, a worker crash, Redis killed and restarted.

After each fault: no deployment spec is lost, every replica is ready again (as the simulated agents run them and as
the console shows them), every host is connected and has acknowledged its last desired state, and no ready replica
was stopped or restarted that the fault did not hit. Each prints how long the fleet took to converge.

Like tests/e2e/test_chaos.py it runs once, in the PostgreSQL + Redis pass (`-m db_stack`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

import aiohttp
import httpx
import pytest

from agent.restarts import BACKOFF_MIN_S
from bench.fleet import issue_tokens, write_model
from bench.fleet_sim import SimAgent, SimFleet, SimSpec
from bench.harness import deploy, register, running_stack
from tests.e2e.stack import Stack, free_port, launch, wait_for
from tests.e2e.test_chaos import scaled_out_or_skip  # the same conditions as the real-process chaos

pytestmark = [pytest.mark.e2e, pytest.mark.db_stack]

HOSTS = 20
GPUS = (2, 4, 8)  # GPUs per simulated host, in turn
DEPLOYMENTS = {"chat": 12, "code": 10, "embed": 8, "rank": 6, "tag": 4}  # 40 replicas
LEASE_S = 3  # short, so that a muted agent lapses within the test
EVICTION_S = 40  # far past every pause here: an unknown host keeps its replicas
# Quick loads and reports; the reconnect backoff capped low so that a restarted console has its fleet back soon.
SPEC = SimSpec(load_s=0.3, report_interval=1.0, backoff_max=2.0, seed=12)
SETTLE_S = 30  # the most any wait for the fleet to converge may take


class SimThread:
    """The simulated fleet on an event loop of a thread of its own, so that it keeps talking while a test blocks
    (on a console restarting, on the REST API). Everything that touches it runs on that loop."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sim-fleet", daemon=True)
        self.thread.start()
        self.fleet: SimFleet = self.call(lambda: SimFleet(url, tokens, SPEC))
        for i, agent in enumerate(self.fleet.agents.values()):
            agent.spec = dataclasses.replace(SPEC, gpus=GPUS[i % len(GPUS)])
        self.run(self.fleet.start())

    def run(self, coroutine, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, fn):
        """fn() on the fleet's loop; its result."""

        async def on_loop():
            return fn()

        return self.run(on_loop())

    def wait(self, predicate, timeout: float, what: str) -> None:
        """Until predicate() (evaluated on the fleet's loop) holds; a TimeoutError naming `what` after `timeout` s."""
        if not self.run(self.fleet.wait_for(predicate, timeout), timeout + 30):
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self.fleet.stop())

        async def cancel_the_rest() -> None:  # replica loads and a duplicate agent still under way
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


@contextlib.asynccontextmanager
async def agent_session():
    """An aiohttp session for an agent outside the fleet, its handshake bounded as SimFleet's own."""
    bound = SPEC.handshake_timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=bound, sock_read=bound)) as s:
        yield s


@dataclass
class Chaos:
    stack: Stack
    redis_port: int
    sim: SimThread | None = None
    redis: subprocess.Popen | None = None
    spec: list[dict] = field(default_factory=list)  # what GET /deployments should keep saying

    @property
    def agents(self) -> dict[str, SimAgent]:
        return self.sim.fleet.agents

    @property
    def replicas(self) -> int:
        return sum(d["replica_count"] for d in self.spec)

    # -- the processes --------------------------------------------------------------------------------------

    def start_redis(self) -> None:
        import redis

        self.redis = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port),
                                       "--save", "", "--appendonly", "no"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.redis_port, socket_timeout=1)

        def answers() -> bool:
            with contextlib.suppress(redis.RedisError):
                return client.ping()
            return False

        wait_for(answers, 10, what="the private redis-server")

    def stop_redis(self) -> None:
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait(10)

    def start_console(self) -> None:
        """The same `manage.py up` again, on the same port, database and data dir."""
        self.stack.proc, self.stack.lines = launch(list(self.stack.proc.args), self.stack.env, "ModelGrid console: ")

    # -- the console's view ---------------------------------------------------------------------------------

    def get(self, path: str) -> list[dict] | None:
        """A list from the REST API (one page of 500), or None while the console does not answer."""
        try:
            with self.stack.api() as api:
                r = api.get(path, params={"per_page": 500})
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def specs(self) -> list[dict] | None:
        deployments = self.get("/deployments")
        keys = ("name", "model", "replica_count", "min_replicas", "max_replicas", "priority")
        return None if deployments is None else [{k: d[k] for k in keys} for d in deployments]

    def console_lag(self) -> list[str]:
        """What the console does not show settled yet: replicas not ready on a host, hosts not connected or with
        a desired state not yet acknowledged. Empty once it shows the fleet converged."""
        hosts, deployments = self.get("/hosts"), self.get("/deployments")
        if hosts is None or deployments is None:
            return ["the console does not answer"]
        lag = [f"{d['name']}#{r['index']} {r['state']} on {r['host']}" for d in deployments for r in d["replicas"]
               if r["state"] != "ready" or not r["host"]]
        lag += [f"{h['name']} {h['state']}, generation {h['generation']} acked {h['acked_generation']}"
                for h in hosts if h["state"] != "connected" or h["acked_generation"] != h["generation"]]
        replicas = sum(len(d["replicas"]) for d in deployments)
        lag += [f"{replicas} of {self.replicas} replicas"] if replicas != self.replicas else []
        return lag + ([f"{len(hosts)} of {HOSTS} hosts"] if len(hosts) != HOSTS else [])

    def failed(self) -> list[tuple[str, str, str, str]]:
        """(deployment, its state, host, the agent's reason) of every replica the console shows failed."""
        return [(d["name"], d["state"], r["host"], r["observed_reason"]) for d in self.get("/deployments") or []
                for r in d["replicas"] if r["state"] == "failed"]

    def host_state(self, name: str) -> str | None:
        hosts = self.get("/hosts") or []
        return next((h["state"] for h in hosts if h["name"] == name), None)

    def placed_on(self, name: str) -> set[tuple[str, int]]:
        """(deployment, replica index) of every replica the console has placed on host `name`."""
        return {(d["name"], r["index"]) for d in self.get("/deployments") or [] for r in d["replicas"]
                if r["host"] == name}

    # -- the fleet's view -----------------------------------------------------------------------------------

    def sim_settled(self) -> bool:
        """(On the fleet's loop) every agent linked, every replica ready on exactly one host, nothing else."""
        fleet = self.sim.fleet
        return (fleet.connected() == HOSTS and len(fleet.ready()) == self.replicas
                and fleet.states() == {"ready": self.replicas})

    def busiest(self) -> str:
        """The host with the most replicas: the most to lose."""
        return self.sim.call(lambda: max(self.agents, key=lambda n: len(self.agents[n].replicas)))

    def running(self) -> dict[int, tuple[str, float]]:
        """Replica id -> (host, when it became ready), over the replicas ready now."""
        return self.sim.call(lambda: {rid: (a.name, a.metrics.ready_at[rid]) for a in self.agents.values()
                                      for rid, r in a.replicas.items() if r.state == "ready"})

    def totals(self) -> dict:
        """What the fleet counted so far: ready replicas taken away, links lost, the console's error replies."""
        return self.sim.call(lambda: {
            "taken away": sum(a.metrics.taken_away for a in self.agents.values()),
            "link losses": sum(a.metrics.link_losses for a in self.agents.values()),
            "errors": collections.Counter(e for a in self.agents.values() for e in a.metrics.errors)})

    # -- before and after a fault ---------------------------------------------------------------------------

    def settle(self, what: str = "the fleet to be settled before the fault") -> tuple[dict, dict]:
        """Wait until the fleet runs everything and the console shows it; then what runs and the totals."""
        self.sim.wait(self.sim_settled, SETTLE_S, what)
        try:
            wait_for(lambda: not self.console_lag(), SETTLE_S, interval=0.25, what=what + " (as the console shows it)")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; not yet: {', '.join(self.console_lag()[:10])}") from None
        return self.running(), self.totals()

    def converged(self, began: float, what: str, totals: dict, excused: str = "\0") -> dict[int, tuple[str, float]]:
        """Wait until converged after the fault `what`; print the time, check that nothing was lost or taken
        away and that the console sent no error (but those that say `excused`); return what runs now."""
        running, after = self.settle(f"the fleet to converge after {what}")
        print(f"{what}: converged in {time.monotonic() - began:.1f} s "
              f"(link losses: {after['link losses'] - totals['link losses']})")
        assert self.specs() == self.spec  # nothing of what the operator asked for was lost
        assert after["taken away"] == totals["taken away"]  # no ready replica was stopped to be placed elsewhere
        errors = [e for e in after["errors"] - totals["errors"] if excused not in e]
        assert not errors, "the console answered agents with errors"
        return running


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    scaled_out_or_skip()
    tmp = tmp_path_factory.mktemp("chaos-fleet")
    redis_port = free_port()
    env = {"REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "MODELGRID_STRATEGY": "balance",
           "MODELGRID_SCHEDULER_INTERVAL": "0.5", "MODELGRID_HOST_LEASE_SECONDS": str(LEASE_S),
           "MODELGRID_RECONNECT_GRACE_SECONDS": "5", "MODELGRID_EVICTION_SECONDS": str(EVICTION_S)}
    with contextlib.ExitStack() as cleanup:
        chaos = Chaos(stack=None, redis_port=redis_port)
        cleanup.callback(chaos.stop_redis)
        chaos.start_redis()  # before the console: its channel layer is this Redis
        chaos.stack = cleanup.enter_context(running_stack(tmp / "data", gpus="sim:1x1GiB", args=("--no-agent",),
                                                          **env))
        chaos.sim = SimThread(chaos.stack.url, issue_tokens(chaos.stack, HOSTS))
        cleanup.callback(chaos.sim.close)
        chaos.sim.wait(lambda: chaos.sim.fleet.connected() == HOSTS, SETTLE_S, "every simulated agent to connect")
        with chaos.stack.api() as api:  # once every host is there: placed over all of them from the start
            register(api, "tiny", write_model(tmp / "tiny"))
            for name, count in DEPLOYMENTS.items():
                deploy(api, name, "tiny", replicas=count)
        chaos.spec = chaos.specs()
        assert chaos.replicas == sum(DEPLOYMENTS.values())
        began = time.monotonic()
        chaos.settle("every replica to be ready")
        print(f"\n{HOSTS} hosts, {chaos.replicas} replicas: ready in {time.monotonic() - began:.1f} s")
        yield chaos


def test_a_killed_console_moves_nothing(chaos):
    before, totals = chaos.settle()
    began = time.monotonic()
    chaos.stack.proc.kill()
    chaos.stack.proc.wait(10)
    time.sleep(LEASE_S + 1)  # down for longer than a lease
    chaos.start_console()
    assert chaos.converged(began, "console kill -9", totals) == before  # every replica where it was, not even restarted
    assert chaos.totals()["link losses"] - totals["link losses"] == HOSTS  # every agent lost its link and is back


def test_a_console_sigterm_restart_moves_nothing(chaos):
    before, totals = chaos.settle()
    began = time.monotonic()
    chaos.stack.proc.send_signal(signal.SIGTERM)
    assert chaos.stack.proc.wait(15) == 0
    chaos.start_console()
    assert chaos.converged(began, "console SIGTERM restart", totals) == before
    assert chaos.totals()["link losses"] - totals["link losses"] == HOSTS


def test_a_duplicate_agent_connection_takes_nothing_down(chaos):
    before, totals = chaos.settle()
    name = chaos.busiest()
    original = chaos.agents[name]
    closes = chaos.sim.call(lambda: superseded(original))
    began = time.monotonic()

    async def duplicate() -> None:
        """A second copy of the agent (a stale process, a copied token) until the console sent it a desired
        state; then it goes away."""
        copy = SimAgent(chaos.stack.url, name, original.token, original.spec)
        async with agent_session() as session:
            task = asyncio.create_task(copy.run(session))
            try:
                await chaos.sim.fleet.wait_for(lambda: copy.metrics.acks, 30)
            finally:
                copy.metrics.connected_since = None  # going away is no link loss
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        assert copy.metrics.acks, "the console sent the duplicate no desired state"

    chaos.sim.run(duplicate(), 60)
    # Its link superseded the original's, which the console closed (4409); the original reconnected.
    assert chaos.sim.call(lambda: superseded(original)) == closes + 1
    assert chaos.converged(began, "a duplicate agent connection", totals) == before


def superseded(agent: SimAgent) -> int:
    """(On the fleet's loop) how many of the agent's links the console closed as superseded by a newer one."""
    return sum(n for why, n in agent.metrics.loss_reasons.items() if "code 4409" in why)


def test_an_agent_muted_past_its_lease_is_unknown_and_keeps_its_replicas(chaos):
    before, totals = chaos.settle()
    name = chaos.busiest()
    placed = chaos.placed_on(name)
    assert placed  # it has something to lose
    began = time.monotonic()
    chaos.sim.call(lambda: chaos.agents[name].mute(LEASE_S + 4))
    wait_for(lambda: chaos.host_state(name) == "unknown", LEASE_S + 4, interval=0.25, what=f"{name} to be unknown")
    print(f"muted agent: unknown after {time.monotonic() - began:.1f} s")
    assert chaos.placed_on(name) == placed  # kept: unknown is not gone
    assert chaos.totals()["taken away"] == totals["taken away"]
    wait_for(lambda: chaos.host_state(name) == "connected", SETTLE_S, interval=0.25,
             what=f"{name} to be connected again")
    assert chaos.converged(began, "agent muted past its lease", totals) == before
    assert chaos.placed_on(name) == placed


def test_a_crashed_worker_is_shown_failed_and_ready_again_once_restarted(chaos):
    before, totals = chaos.settle()
    rid, (host, _) = min(before.items())
    agent = chaos.agents[host]
    deployment = chaos.sim.call(lambda: agent.metrics.deployment_of[rid])
    began = time.monotonic()
    chaos.sim.call(lambda: agent.crash(rid, "simulated worker crash"))
    # Shown where it was, with the agent's reason, its deployment failed (and nothing else).
    shown = [(deployment, "failed", host, "simulated worker crash")]
    wait_for(lambda: chaos.failed() == shown, 10, interval=0.1, what=f"the console to show {shown}")
    print(f"crashed worker: shown failed after {time.monotonic() - began:.1f} s")
    # The agent restarts it after its backoff (the console sends no new generation for a failure).
    after = chaos.converged(began, "a crashed worker", totals)
    assert after[rid][0] == host and after[rid][1] > began + BACKOFF_MIN_S  # ready again where it was, a new worker
    assert {k: v for k, v in after.items() if k != rid} == {k: v for k, v in before.items() if k != rid}


# The first use of a pooled Redis connection from before the restart raises ConnectionError ("Connection closed
# by server"): a committed PATCH must still answer 200 (its scheduler wake-up is lost, not the change), and a
# hello that meets it must end its link (the agent reconnects) rather than leave it outside its host's group.
def test_a_redis_restart_drops_nothing(chaos):
    before, totals = chaos.settle()
    began = time.monotonic()
    chaos.stop_redis()
    time.sleep(1)
    chaos.start_redis()
    # The links work through the fresh Redis: a replica added now reaches an agent and is started.
    with chaos.stack.api() as api:
        assert api.patch("/deployments/tag", json={"replicas": DEPLOYMENTS["tag"] + 1}).status_code == 200
    chaos.spec = chaos.specs()
    # While Redis is down the console refuses a hello it cannot apply (it says so, and the agent retries).
    after = chaos.converged(began, "redis kill -9 and restart", totals, excused="could not apply this hello")
    assert len(after) == len(before) + 1
    assert {k: v for k, v in after.items() if k in before} == before
