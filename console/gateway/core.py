"""The gateway's per-process state: the fleet snapshot, requests in flight, concurrency limits, the demand
queues of deployments without a ready replica, and the bookkeeping the scheduler reads (demand, when each
replica was last used, what clients saw).

Everything on the request path is memory; the database is read by one refresher and written by one
flusher, both background tasks of this object, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import os
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from channels.layers import get_channel_layer

from console.control.hub import wake_scheduler_async
from console.control.layer import GATEWAY_GROUP, listen
from console.dbthreads import own_thread
from console.deployments.serving import COLD
from console.gateway import bookkeeping
from console.gateway.auth import Caller, TokenCache, lookup
from console.gateway.failover import Waiting
from console.gateway.fleet import DeploymentView, FleetView, ReplicaView, load_fleet
from console.gateway.flow import FlowQueue
from console.gateway.limits import Hold, Limiter, Over
from console.gateway.metrics import METRICS, ConsoleMetrics
from console.gateway.predict import Features, Predictor
from console.gateway.prefix_index import BLOCK_BYTES, PrefixIndex, block_hashes, prompt_text
from console.gateway.refused import Refused
from console.gateway.reservation import NOTHING, Need
from console.gateway.routing import predicted_choice, prefix_choice
from console.gateway.slots import ANY, Ask, Picked, SlotKeeper
from console.gateway.upstream import Upstream
from console.gateway.usage import Tally
from console.usage import store as usage_store

log = logging.getLogger("modelgrid.gateway")

IDLE_REFRESH_S = 1.0  # the snapshot's age at most when nothing is waiting (events refresh it sooner), or IDLE_SHARE's
REST_SHARE = 2.0  # with nothing waiting, a refresh is followed by this many times its duration without one
IDLE_SHARE = 10.0  # ... and, without an event, the next comes no sooner than this many times its duration
WAITING_REFRESH_S = 0.05  # while requests wait for a replica: how soon a ready one is seen without an event
FLUSH_S = 0.5  # bookkeeping written this often
SUSPECT_S = 10.0  # a replica that refused a connection is avoided this long unless it reports anew
ASK_KEPT_S = 2 * bookkeeping.DEMAND_RENEW_S  # an ask for another replica counts as demand this long after it was made


@dataclass(frozen=True)
class GatewaySettings:
    queue_wait_s: float = 60.0
    queue_max: int = 256
    token_concurrency: int = 64
    deployment_concurrency: int = 256
    max_body_bytes: int = 16 * 1024 * 1024
    connect_timeout_s: float = 5.0  # to an agent's inference port
    response_timeout_s: float = 360.0  # for an answer's headers (a whole non-streamed generation)
    stream_idle_s: float = 120.0  # between two pieces of a streamed answer
    prefix_routing: bool = True  # send prompts that share a prefix to the replica that was sent it (prefix_index.py)
    replica_slots: int = 32  # requests in flight per ready replica; more wait in the deployment's flow queue (flow.py)

    @classmethod
    def from_django(cls) -> GatewaySettings:
        from django.conf import settings

        return cls(queue_wait_s=settings.MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS,
                   queue_max=settings.MODELGRID_GATEWAY_QUEUE_MAX,
                   token_concurrency=settings.MODELGRID_GATEWAY_TOKEN_CONCURRENCY,
                   deployment_concurrency=settings.MODELGRID_GATEWAY_DEPLOYMENT_CONCURRENCY,
                   max_body_bytes=settings.MODELGRID_GATEWAY_MAX_BODY_BYTES,
                   connect_timeout_s=settings.MODELGRID_GATEWAY_CONNECT_TIMEOUT_SECONDS,
                   response_timeout_s=settings.MODELGRID_GATEWAY_RESPONSE_TIMEOUT_SECONDS,
                   stream_idle_s=settings.MODELGRID_GATEWAY_STREAM_IDLE_SECONDS,
                   prefix_routing=settings.MODELGRID_GATEWAY_PREFIX_ROUTING,
                   replica_slots=settings.MODELGRID_GATEWAY_REPLICA_SLOTS)


@dataclass(order=True)
class _Waiter:
    rank: int  # higher tiers first, then arrival order
    seq: int
    future: asyncio.Future = field(compare=False)
    since: float = field(compare=False, default=0.0)


class Gateway(SlotKeeper):
    """One console process's gateway."""

    def __init__(self, settings: GatewaySettings | None = None, metrics: ConsoleMetrics = METRICS) -> None:
        self.settings = settings or GatewaySettings.from_django()
        self.metrics = metrics
        self.fleet = FleetView()
        self.tokens = TokenCache(own_thread(lookup))
        self.limiter = Limiter()  # requests and tokens per minute, quotas: counted with the other consoles
        self.outstanding: dict[int, int] = {}  # replica id -> requests in flight through this process
        self.per_token: dict[str, int] = {}
        self.per_deployment: dict[str, int] = {}
        self.suspects: dict[int, float] = {}  # replica id -> when a connection to it failed
        self.prefixes: dict[str, PrefixIndex] = {}  # deployment -> which replicas were sent which prompt prefixes
        self.waiters: dict[str, list[_Waiter]] = {}
        self.flows: dict[str, FlowQueue] = {}  # deployment -> requests waiting for one of its replicas' slots
        self.granted: dict[str, int] = {}  # deployment -> slots handed to waiting requests not yet taken
        self.held: dict[tuple[str, str], int] = {}  # (deployment, flow) -> slots it holds or was granted
        self.recent: dict[str, dict[str, float]] = {}  # deployment -> flow -> when it last sent a request
        self.predictor = Predictor()
        self.prefilling: dict[int, float] = {}  # replica id -> uncached KiB sent to it and not yet at its first byte
        self.freeing: dict[str, tuple[float, float]] = {}  # deployment -> (last slot freed, mean seconds between)
        self.asked: dict[str, float] = {}  # deployment -> when a request last asked for another replica of it
        self.book = bookkeeping.Book(f"{socket.gethostname()}:{os.getpid()}")
        self.usage = Tally()  # what requests cost, per minute, team, token and deployment, until the next flush
        self.upstream = Upstream(self.settings.connect_timeout_s)
        self.waiting = Waiting()  # requests waiting for replicas' answers: sent elsewhere when a host is lost
        self._seq = itertools.count()
        self._turn = itertools.count()
        self.rng = random.Random()  # routes' weighted choices (tests seed it)
        self._poke = asyncio.Event()
        self._demand_written: dict[str, float] = {}  # deployment -> monotonic time its demand reached the DB
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()  # fire-and-forget writes, held so they are not collected
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Future | None = None

    # --- lifecycle ----------------------------------------------------------------------------------

    async def ensure_started(self) -> None:
        """Load the fleet and start the background tasks on first use (in the serving loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._starting is not None:
            if not self._starting.done():  # another request is loading the fleet: wait for it
                await asyncio.shield(self._starting)
            elif self._starting.exception() is not None:
                raise self._starting.exception()
            return
        self._loop, self._starting = loop, loop.create_future()
        self._poke = asyncio.Event()
        try:
            await self.refresh()
            await self.limiter.sync()  # the teams' limits known before the first request is admitted
            self._tasks = [loop.create_task(self._refresher()), loop.create_task(self._flusher()),
                           loop.create_task(self._listen()), loop.create_task(self.limiter.run())]
            self._starting.set_result(None)
        except BaseException as e:
            self._starting.set_exception(e)
            self._loop = None
            raise

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks, self._loop, self._starting = [], None, None
        with contextlib.suppress(Exception):
            await self.flush()
        with contextlib.suppress(Exception):  # what it counted since the last sync still binds the other consoles
            await self.limiter.sync()
        await self.upstream.close()

    def poke(self) -> None:
        """Refresh the snapshot now (something changed in the fleet)."""
        self._poke.set()

    async def refresh(self) -> None:
        began = time.monotonic()
        self.fleet = await own_thread(load_fleet)()
        self.waiting.lapse(self.fleet.hosts)  # a host no longer connected: its waiting requests go elsewhere
        ready = {r.id for d in self.fleet.deployments.values() for r in d.ready}
        # A suspect that the fleet no longer lists as ready will be routable once it reports ready again.
        for rid in [r for r, t in self.suspects.items() if r not in ready or began - t > SUSPECT_S]:
            del self.suspects[rid]
        for name in list(self.prefixes):  # a replica that is no longer ready lost its cache (stopped, asleep, gone)
            if (dep := self.fleet.deployments.get(name)) is None:
                del self.prefixes[name]
            else:
                self.prefixes[name].keep({r.id for r in dep.ready})
        self._release(began)
        for name in list(self.flows):
            self._dispatch(name)
        self.predictor.forget(set(self.fleet.deployments))
        for kept in (self.recent, self.freeing, self.asked):
            for name in [n for n in kept if n not in self.fleet.deployments]:
                del kept[name]

    async def _refresher(self) -> None:
        took = 0.0  # the last refresh's duration
        while True:
            # Unless a request waits for a replica, a large fleet's snapshot (0.2-0.4 s of CPU at 10,000 replicas)
            # is taken at most a third of the time while the fleet changes, and a tenth of it while it is quiet.
            rest_until = time.monotonic() + REST_SHARE * took
            while not self.waiters and (rest := rest_until - time.monotonic()) > 0:
                await asyncio.sleep(min(rest, WAITING_REFRESH_S))  # a request that begins to wait ends the rest
            interval = WAITING_REFRESH_S if self.waiters else max(IDLE_REFRESH_S, IDLE_SHARE * took)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), interval)
            self._poke.clear()
            began = time.monotonic()
            try:
                await self.refresh()
                took = time.monotonic() - began  # (a failed one's wait below is no measure of a snapshot's cost)
            except Exception:  # the database may be briefly unavailable; the snapshot stays as it was
                log.exception("gateway: cannot refresh the fleet")
                await asyncio.sleep(IDLE_REFRESH_S)

    async def _listen(self) -> None:
        """Refresh on the channel layer's fleet events (scheduler passes, replica state changes)."""
        if get_channel_layer() is None:
            return
        await listen(GATEWAY_GROUP, lambda _: self._poke.set())

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                await self.flush()
            except Exception:
                log.exception("gateway: cannot write its bookkeeping")

    async def flush(self) -> None:
        demand = {name: len(ws) for name, ws in self.waiters.items()}
        now = time.monotonic()
        for name, at in list(self.asked.items()):
            if now - at > ASK_KEPT_S:
                del self.asked[name]
            else:  # waking or starting one more replica beats queueing: the scheduler adds one (scheduler/demand.py)
                demand[name] = max(demand.get(name, 0), len(self.flows.get(name, ())), 1)
        busy = {rid for rid, n in self.outstanding.items() if n}
        batch = self.book.drain(demand, busy, time.time())
        if await own_thread(bookkeeping.write)(batch):
            await wake_scheduler_async()  # traffic began: the scheduler plans with the figures from now on
        if usage := self.usage.drain():
            # Shielded: cancelled (the gateway closing) while it waits for a database thread, a write would be
            # dropped with what it took; it finishes first, or gives it back.
            call = asyncio.ensure_future(own_thread(usage_store.write)(usage))
            try:
                await asyncio.shield(call)
            except asyncio.CancelledError:
                await asyncio.wait([call])
                if call.exception() is not None:
                    self.usage.restore(usage)
                raise
            except Exception:
                self.usage.restore(usage)  # carried by the next flush
                raise

    # --- admission ----------------------------------------------------------------------------------

    async def authenticate(self, token: str | None) -> Caller | None:
        return None if not token else await self.tokens.caller(token)

    def admit(self, caller: Caller, dep: DeploymentView, again: bool = False, need: Need = NOTHING) -> Hold:
        """Count a request against its token's and its deployment's concurrency, and its token's and team's (the
        deployment's) rates and quota, holding the tokens it may use (`need`) until account() settles them; or 429
        saying which limit it met, 400 when it could never fit one. A refused request is counted and holds nowhere.
        `again`: a route's fallback for a request its branch's admission counted already (its first reservation
        settled when that branch answered): it holds its own, and is not counted, nor refused, twice. An admitted
        request is in flight, against both concurrency limits, until release() (a stream's: when it ends)."""
        s = self.settings
        if self.per_token.get(caller.token_key, 0) >= s.token_concurrency:
            raise Refused(429, f"this token already has {s.token_concurrency} requests in flight (the limit); "
                          "retry when one finishes", retry_after=1, code="rate_limited", callers=True)
        if self.per_deployment.get(dep.name, 0) >= s.deployment_concurrency:
            raise Refused(429, f"model {dep.name!r} already has {s.deployment_concurrency} requests in flight "
                          "(the limit)", retry_after=1, code="rate_limited")
        hold = self.limiter.admit(caller.token_id, caller.label, caller.rpm_limit, caller.tpm_limit, dep.team,
                                  need=need, again=again)
        if isinstance(hold, Over):
            raise Refused(hold.status, hold.message, retry_after=hold.retry_after, code=hold.code, callers=True)
        self.per_token[caller.token_key] = self.per_token.get(caller.token_key, 0) + 1
        self.per_deployment[dep.name] = self.per_deployment.get(dep.name, 0) + 1
        return hold

    def release(self, caller: Caller, deployment: str) -> None:
        """An admitted request is over: it no longer counts against its token's and deployment's concurrency."""
        for counts, key in ((self.per_token, caller.token_key), (self.per_deployment, deployment)):
            counts[key] -= 1
            if not counts[key]:
                del counts[key]

    @contextlib.contextmanager
    def admitted(self, caller: Caller, dep: DeploymentView, again: bool = False,
                 need: Need = NOTHING) -> Iterator[Hold]:
        """admit() for the block's length, then release()."""
        hold = self.admit(caller, dep, again, need)
        try:
            yield hold
        finally:
            self.release(caller, dep.name)

    # --- waiting for a ready replica ---------------------------------------------------------------

    async def ready_view(self, name: str) -> tuple[DeploymentView, float]:
        """The deployment with at least one usable ready replica, and how long this request waited for one
        (seconds). Waits in the deployment's queue while the scheduler wakes or places a replica."""
        dep = self.fleet.deployments.get(name)
        if dep is not None and self._usable(dep):
            return dep, 0.0
        if dep is not None and dep.serving == "standby":
            raise Refused(503, f"model {name!r} is standing by (loaded, taking no requests); turn standby off "
                          "to serve it", code="model_not_ready")
        if dep is not None and dep.serving == COLD and dep.start_s and dep.start_s > self.settings.queue_wait_s:
            # Its start outlasts the wait: waiting would only time out. It starts anyway (the demand, and this
            # request in its last-used time, keep the scheduler from scaling it back to zero), for the retry.
            self._announce_cold(name)
            retry = math.ceil(dep.start_s)
            raise Refused(503, f"model {name!r} is stopped: a replica takes about {dep.start_s:.0f} s to start (its "
                          f"last start), longer than a request waits here ({self.settings.queue_wait_s:g} s); one is "
                          f"starting now: retry after {retry} s", retry_after=retry, code="model_not_ready")
        queue = self.waiters.setdefault(name, [])
        if len(queue) >= self.settings.queue_max:
            raise Refused(429, f"model {name!r} already has {len(queue)} requests waiting for a replica "
                          "(the queue's limit)", retry_after=1, code="queue_full")
        loop = asyncio.get_running_loop()
        began = loop.time()
        waiter = _Waiter(dep.rank if dep else 99, next(self._seq), loop.create_future(), time.monotonic())
        heapq.heappush(queue, waiter)
        if len(queue) == 1:
            self._spawn(self._announce_demand(name))
        self._poke.set()
        outcome = "served"
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.settings.queue_wait_s)
            return waiter.future.result(), loop.time() - began
        except TimeoutError:
            outcome = "timeout"
            dep = self.fleet.deployments.get(name)
            why = f": {dep.demand_reason}" if dep and dep.demand_reason else ""
            raise Refused(503, f"no replica of model {name!r} became ready within {self.settings.queue_wait_s:g} s"
                          f"{why}", retry_after=5, code="model_not_ready") from None
        except Refused:
            outcome = "refused"
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._forget(name, waiter)
            self.metrics.demand_waits.labels(name, outcome).observe(loop.time() - began)

    def _announce_cold(self, name: str) -> None:
        """Demand for a cold deployment no request waits for, at most once per renewal interval."""
        written = self._demand_written.get(name)
        if name not in self.waiters and (written is None or time.monotonic() - written >= bookkeeping.DEMAND_RENEW_S):
            self._demand_written[name] = time.monotonic()
            self._spawn(self._announce_demand(name))

    def _usable(self, dep: DeploymentView) -> bool:
        return any(r.id not in self.suspects for r in dep.ready)

    def _forget(self, name: str, waiter: _Waiter) -> None:
        queue = self.waiters.get(name)
        if queue is None:
            return
        if waiter in queue:
            queue.remove(waiter)
            heapq.heapify(queue)
        if not queue:
            del self.waiters[name]
            self._spawn(self._withdraw_demand(name))

    def _spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _announce_demand(self, name: str) -> None:
        try:
            await own_thread(bookkeeping.announce_demand)(name, len(self.waiters.get(name, ())) or 1)
            self._demand_written[name] = time.monotonic()
            await wake_scheduler_async()
        except Exception:
            log.exception("gateway: cannot announce demand for %s", name)

    async def _withdraw_demand(self, name: str) -> None:
        if name in self.waiters:
            return  # new requests came while this was scheduled
        self._demand_written.pop(name, None)
        with contextlib.suppress(Exception):
            await own_thread(bookkeeping.withdraw_demand)(name)

    def _release(self, loaded_at: float) -> None:
        """Hand waiting requests a deployment that became ready (higher tiers, then arrival order), or the
        scheduler's refusal when it says the demand cannot be served."""
        for name in list(self.waiters):
            queue = self.waiters[name]
            dep = self.fleet.deployments.get(name)
            if dep is None:
                self._fail_all(queue, Refused(404, f"model {name!r} was deleted while the request waited",
                                              code="model_not_found"))
                continue
            if self._usable(dep):
                for waiter in sorted(queue):
                    if not waiter.future.done():
                        waiter.future.set_result(dep)
                continue
            written = self._demand_written.get(name)
            # A refusal counts only if the scheduler made it after this demand reached the database.
            if dep.demand_status == "refused" and written is not None and loaded_at > written:
                self._fail_all(queue, Refused(503, f"model {name!r} cannot be served now: {dep.demand_reason}",
                                              retry_after=30, code="unschedulable"))

    @staticmethod
    def _fail_all(queue: list[_Waiter], error: Refused) -> None:
        for waiter in queue:
            if not waiter.future.done():
                waiter.future.set_exception(error)

    # --- routing ------------------------------------------------------------------------------------

    def prompt_blocks(self, path: str, body: dict | None, dep: DeploymentView, adapter: str | None) -> tuple:
        """The chain hashes of a completion's or chat's leading text blocks (bounded: prefix_index.MAX_BLOCKS), the
        deployment and adapter folded in first; none when prefix routing is off or the body has no text prompt."""
        if not self.settings.prefix_routing:
            return ()
        return block_hashes(prompt_text(path, body), f"{dep.name}\x1f{adapter or ''}")

    def pick(self, dep: DeploymentView, adapter: str | None, avoid: set[int] = frozenset(),
             blocks: tuple = (), ask: Ask = ANY) -> Picked | None:
        """A usable replica for the request, slots regardless (acquire() keeps to free ones); None when none is."""
        usable = [r for r in dep.ready if r.id not in self.suspects and r.id not in avoid]
        return self._choose(dep, adapter, usable, blocks, ask) if usable else None

    def _choose(self, dep: DeploymentView, adapter: str | None, replicas: list[ReplicaView], blocks: tuple,
                ask: Ask) -> Picked:
        """Of `replicas`, the one with the lowest predicted time to first token (predict.py: its uncached share of the
        prompt, from the prefix index, and its load) within the bounded-load bound; for an adapter, consistent
        hashing with bounded loads (its weights stay resident on few replicas). The chosen replica is remembered as
        holding the prompt's leading `blocks`."""
        by_id = {r.id: r for r in replicas}
        ids = list(by_id)
        index = self.prefixes.get(dep.name)
        matches = index.matches(blocks, ids) if index is not None and blocks else {}
        features = {r: self._features(ask, matches.get(r, 0), r) for r in ids}
        predicted = {r: self.predictor.predict(dep.name, ask.streamed, f) for r, f in features.items()}
        if adapter is not None:
            chosen, reason = prefix_choice(matches, len(blocks), ids, self.outstanding, next(self._turn), adapter)
        else:
            chosen, reason = predicted_choice(predicted, matches, len(blocks), ids, self.outstanding, next(self._turn))
        if blocks:
            if index is None:
                index = self.prefixes[dep.name] = PrefixIndex()
            index.sent(blocks, chosen)
        return Picked(by_id[chosen], reason, predicted[chosen], features[chosen], dep.name, ask.streamed, ask.flow)

    def _features(self, ask: Ask, held_blocks: int, replica: int) -> Features:
        uncached = max(0, ask.prompt_bytes - held_blocks * BLOCK_BYTES)
        return Features(uncached / 1024, self.outstanding.get(replica, 0), 0.0 if ask.streamed else ask.generate / 1000,
                        self.prefilling.get(replica, 0.0))

    def suspect(self, replica: ReplicaView) -> None:
        """A connection to `replica` failed: avoid it until it reports anew (or SUSPECT_S passes)."""
        self.suspects[replica.id] = time.monotonic()
        self._poke.set()

    def record(self, deployment: str, adapter: str | None, status: int, seconds: float, queue_s: float,
               served: bool = True) -> None:
        """`served` False: refused for the caller's own limit, which says nothing of the deployment's latency or
        capacity: counted as a request, kept out of its latency, its SLO and the scaling loop's figures."""
        labels = (deployment, adapter or "")
        self.metrics.requests.labels(*labels, str(status)).inc()
        if not served:
            return
        self.metrics.latency.labels(*labels).observe(seconds)
        self.metrics.queue.labels(*labels).observe(queue_s)
        dep = self.fleet.deployments.get(deployment)
        self.metrics.slo(deployment, dep.slo_latency_ms if dep else None, status, seconds)
        self.book.observe(deployment, seconds, status, time.time(), queue_s)

    def account(self, deployment: str, team: int, caller: Caller, status: int, queue_s: float, prompt: int = 0,
                completion: int = 0, hold: Hold | None = None) -> None:
        """Account one finished request that reached `deployment` (its engine's token counts; none for v2), settling
        the reservation its admission held (`hold`; without one, its tokens count now)."""
        self.usage.add(deployment, team, caller.token_id, status, queue_s, prompt, completion)
        if hold is not None:
            self.limiter.settle(hold, prompt + completion)
        else:
            self.limiter.charge(caller.token_id, team, prompt + completion)
