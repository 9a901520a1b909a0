"""Replica slots and flow control, the gateway's half that decides when and where a request is sent: each ready
replica takes `replica_slots` requests; more wait in the deployment's flow queue (flow.py) for a slot granted in band
and fair-share order, or are shed; each request sent counts in its replica's prefill backlog until its first byte,
and the predictor (predict.py) learns from when that came. A mixin of core.Gateway, whose state it keeps."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from console.gateway.fleet import DeploymentView, ReplicaView
from console.gateway.flow import BANDS, FlowQueue, Ticket
from console.gateway.predict import Features
from console.gateway.refused import Refused

if TYPE_CHECKING:
    from console.gateway.core import Gateway

FREE_EVERY_S = 0.5  # until measured: how often a busy deployment's slot frees (for the predicted wait for one)
ACTIVE_S = 2.0  # a flow that sent a request this recently keeps its share of a deployment's slots


class Ask(NamedTuple):
    """What flow control and the predictor know of a request before it is sent."""

    band: int = 1  # flow.BANDS' index: critical, standard, sheddable
    flow: str = ""  # whose: its token's key (fair shares are per flow)
    cost: float = 1.0  # its tokens as reservation.need bounds them: what a fair share is counted in
    prompt_bytes: int = 0
    generate: int = 0  # tokens generated before its first byte comes back: all of them unless it streams
    streamed: bool = False


ANY = Ask()
WAIT = object()  # acquire_now(): no slot now
ASKED = "; asked for another replica"  # a routing reason's ending when the scheduler was asked for another replica
SHEDDABLE = BANDS.index("sheddable")


class Picked(NamedTuple):
    replica: ReplicaView
    reason: str  # why it was chosen, for the answer's x-modelgrid-routing header (routing.prefix_choice)
    predicted: float = 0.0  # seconds to its first byte, as predict.py expected when it was sent
    features: Features | None = None
    deployment: str = ""
    streamed: bool = False
    flow: str = ""  # whose request (Ask.flow): its slot counts against that flow's share


class Slot:
    """A replica slot in_flight() holds: `kept` hands it on (to a stream, which frees it when it ends)."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept = False


class Sent:
    """One request sent to a replica, until its first byte (or its end without one): once."""

    __slots__ = ("gw", "picked", "at", "ok", "open")

    def __init__(self, gw: Gateway, picked: Picked, at: float) -> None:
        self.gw, self.picked, self.at, self.ok, self.open = gw, picked, at, True, True

    def first_byte(self, when: float | None) -> None:
        """Its first byte came at `when` (time.monotonic()), or (None) it ended without one: it leaves the replica's
        prefill backlog, and the predictor learns from it when it came and the answer is no error (`ok`)."""
        if not self.open:
            return
        self.open = False
        picked, backlog = self.picked, self.gw.prefilling
        if picked.features is not None and picked.replica.id in backlog:
            left = backlog[picked.replica.id] - picked.features.uncached_kb
            if left > 1e-9:
                backlog[picked.replica.id] = left
            else:
                del backlog[picked.replica.id]
        if when is not None and self.ok:
            self.gw.learn(picked, when - self.at)


class SlotKeeper:
    """Gateway's slots, flow queues, shedding, asks for another replica and prefill backlog (its __init__ holds the
    state: outstanding, flows, granted, held, recent, freeing, asked, prefilling, predictor)."""

    async def acquire(self, dep: DeploymentView, adapter: str | None, avoid: set[int] = frozenset(),
                      blocks: tuple = (), ask: Ask = ANY, budget: float | None = None) -> Picked | None:
        """A replica slot for the request, taken (free it with free()): at once when one is free and nobody waits;
        else after waiting in the deployment's flow queue (flow.py) for its turn. None when no replica is usable
        at all (the caller waits for one: ready_view). A sheddable request that would wait past the deployment's
        SLO (without one: that would wait at all) is refused 429 saturated at once, and one still waiting when its
        SLO would be broken is refused so then; any wait ends within `budget` seconds (the queue wait; 503). When
        another replica (a sleeping one's wake, a new one's start) would serve sooner than the queue, the
        scheduler is asked for one, and the reason says so."""
        name, loop = dep.name, asyncio.get_running_loop()
        began, granted, asked = loop.time(), False, False
        limit = self.settings.queue_wait_s if budget is None else budget
        while True:
            dep = self.fleet.deployments.get(name, dep)
            picked = self.acquire_now(dep, adapter, avoid, blocks, ask, granted)
            if granted and picked is WAIT:  # granted a slot of a replica it avoids (one it tried, no longer suspect)
                picked = self.acquire_now(dep, adapter, frozenset(), blocks, ask, granted)
            if granted and not isinstance(picked, Picked):  # its grant met no free slot (a replica left): not held
                self._hold((name, ask.flow), -1)
            granted = False
            if picked is not WAIT:
                if asked and picked is not None and not picked.reason.endswith(ASKED):
                    picked = picked._replace(reason=picked.reason + ASKED)
                return picked
            usable = [r for r in dep.ready if r.id not in self.suspects and r.id not in avoid]
            queue = self.flows.get(name)
            wait = self._predicted_wait(name, ask.band)
            best = min(self.predictor.predict(name, ask.streamed, self._features(ask, 0, r.id)) for r in usable)
            self._refuse_if_saturated(dep, ask, wait, best, len(usable))
            asked = self._ask_another(dep, wait + best, ask) or asked
            left = limit - (loop.time() - began)
            if left <= 0:
                raise Refused(503, f"model {name!r} is saturated: no replica slot came free within the "
                              f"{self.settings.queue_wait_s:g} s a request may wait", retry_after=5, code="saturated")
            if queue is None:
                queue = self.flows[name] = FlowQueue()
            if len(queue) >= self.settings.queue_max:
                raise Refused(429, f"model {name!r} already has {len(queue)} requests waiting for a replica slot "
                              "(the queue's limit)", retry_after=max(1.0, wait), code="queue_full")
            ticket = queue.push(ask.band, ask.flow, ask.cost, loop.create_future())
            self._dispatch(name)
            self._gauge(name)
            slack = None  # a sheddable request's time until its first token would break the SLO
            if ask.band == SHEDDABLE and dep.slo_latency_ms is not None:
                slack = dep.slo_latency_ms / 1000 - best - (loop.time() - began)
            try:
                await self._turn_of(dep, ticket, min(left, slack) if slack is not None else left,
                                    shed=slack is not None and slack < left)
            except BaseException:
                self.metrics.flow_wait.labels(name, BANDS[ask.band]).observe(loop.time() - began)
                raise
            finally:
                self._gauge(name)
            self.metrics.flow_wait.labels(name, BANDS[ask.band]).observe(loop.time() - began)
            granted = True  # a slot was held for it until now: taken at once (no await between), or it waits again

    def acquire_now(self, dep: DeploymentView, adapter: str | None, avoid: set[int] = frozenset(),
                    blocks: tuple = (), ask: Ask = ANY, granted: bool = False) -> Picked | None | object:
        """acquire() when it need not wait: a slot taken, None (no usable replica), or WAIT (no free slot, or others
        wait first; `granted`: this request was granted one, so it goes)."""
        usable = [r for r in dep.ready if r.id not in self.suspects and r.id not in avoid]
        if not usable:
            return None
        self._seen(dep.name, ask.flow)
        free = [r for r in usable if self.outstanding.get(r.id, 0) < self.settings.replica_slots]
        if not free:
            return WAIT
        if not granted and (self.flows.get(dep.name) or self.held.get((dep.name, ask.flow), 0) >= self._share(dep)
                            or self._open_slots(free) <= self.granted.get(dep.name, 0)):  # those are granted
            return WAIT
        picked = self._choose(dep, adapter, free, blocks, ask)
        if self._ask_another(dep, picked.predicted, ask):
            picked = picked._replace(reason=picked.reason + ASKED)
        self.take(picked.replica, None if granted else (dep.name, ask.flow))  # a grant counted it already
        return picked

    def _open_slots(self, replicas: list[ReplicaView]) -> int:
        return sum(max(0, self.settings.replica_slots - self.outstanding.get(r.id, 0)) for r in replicas)

    def _seen(self, name: str, flow: str) -> None:
        seen = self.recent.setdefault(name, {})
        seen[flow] = now = time.monotonic()
        if len(seen) > 64:
            self.recent[name] = {f: t for f, t in seen.items() if now - t <= ACTIVE_S}

    def _share(self, dep: DeploymentView) -> float:
        """The most slots one flow may hold while others are active: all of them, split evenly (rounded up); no
        bound for a flow alone. Kept for flows that come back within ACTIVE_S, so another key's next request finds a
        slot free rather than waiting for one of a flood's to end."""
        now = time.monotonic()
        active = sum(1 for t in self.recent.get(dep.name, {}).values() if now - t <= ACTIVE_S)
        if active <= 1:
            return math.inf
        usable = sum(1 for r in dep.ready if r.id not in self.suspects)
        return max(1, math.ceil(self.settings.replica_slots * usable / active))

    async def _turn_of(self, dep: DeploymentView, ticket: Ticket, budget: float, shed: bool = False) -> None:
        """Until `ticket`'s turn comes (a slot was granted to it), within `budget` seconds: else 503, or (`shed`: the
        budget is a sheddable request's slack under its SLO) 429 saturated."""
        future: asyncio.Future = ticket.waiter
        name = dep.name
        try:
            await asyncio.wait_for(asyncio.shield(future), max(budget, 0.0))
        except TimeoutError:
            if not future.done():
                if shed:
                    self.metrics.shed.labels(name, "sheddable", "over_slo").inc()
                    raise Refused(429, f"model {name!r} is saturated: a sheddable request waited for a replica slot "
                                  f"until its first token could no longer come within its SLO ({dep.slo_latency_ms} "
                                  "ms)", retry_after=1, code="saturated") from None
                raise Refused(503, f"model {name!r} is saturated: no replica slot came free within the "
                              f"{self.settings.queue_wait_s:g} s a request may wait", retry_after=5,
                              code="saturated") from None
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._hold((name, ticket.flow), -1)
                self._ungrant(name)  # granted as it left: the slot goes to the next in line
            raise
        finally:
            if (queue := self.flows.get(name)) is not None:
                queue.drop(ticket)
                if not queue:
                    del self.flows[name]
        self._ungrant(name, dispatch=False)

    def _ungrant(self, name: str, dispatch: bool = True) -> None:
        self.granted[name] -= 1
        if not self.granted[name]:
            del self.granted[name]
        if dispatch:
            self._dispatch(name)

    def _dispatch(self, name: str) -> None:
        """Grant the deployment's free slots to its waiting requests, in the flow queue's order."""
        queue = self.flows.get(name)
        if not queue:
            return
        dep = self.fleet.deployments.get(name)
        if dep is None:
            while (ticket := queue.pop()) is not None:
                if not ticket.waiter.done():
                    ticket.waiter.set_exception(Refused(404, f"model {name!r} was deleted while the request waited",
                                                        code="model_not_found"))
            return
        usable = [r for r in dep.ready if r.id not in self.suspects]
        # None usable (gone, suspect): every waiting request is woken to find so and wait for a ready one instead.
        free = self._open_slots(usable) - self.granted.get(name, 0) if usable else len(queue)
        share = self._share(dep)
        while free > 0 and (ticket := queue.pop(lambda f: self.held.get((name, f), 0) < share)) is not None:
            if ticket.waiter.done():
                continue
            ticket.waiter.set_result(None)
            self.granted[name] = self.granted.get(name, 0) + 1
            self._hold((name, ticket.flow), 1)
            free -= 1

    def _predicted_wait(self, name: str, band: int) -> float:
        """Seconds until a slot would come free for a new request of `band`: the requests ahead of it and itself,
        times how often one of the deployment's slots frees (measured while they are all taken)."""
        queue = self.flows.get(name)
        ahead = queue.ahead(band) if queue is not None else 0
        every = self.freeing.get(name, (0.0, FREE_EVERY_S))[1]
        return (ahead + 1) * every

    def _refuse_if_saturated(self, dep: DeploymentView, ask: Ask, wait: float, ttft: float, replicas: int) -> None:
        if ask.band != SHEDDABLE:
            return
        slo = dep.slo_latency_ms
        if slo is not None and (wait + ttft) * 1000 <= slo:
            return
        why = "over_slo" if slo is not None else "busy"
        self.metrics.shed.labels(dep.name, "sheddable", why).inc()
        target = f"past its SLO ({slo} ms)" if slo is not None else "at all (it has no SLO)"
        raise Refused(429, f"model {dep.name!r} is saturated: all {replicas * self.settings.replica_slots} replica "
                      f"slots are taken, and a sheddable request would wait {target}: predicted first token in "
                      f"{wait + ttft:.2f} s", retry_after=max(1.0, wait), code="saturated")

    def _ask_another(self, dep: DeploymentView, expected: float, ask: Ask) -> bool:
        """Ask the scheduler for another replica of `dep` when it would serve this request sooner than `expected`
        (seconds to the first token where it would go now): a sleeping one woken, or a new one started. Whether it
        asked."""
        if dep.another_s is None:
            return False
        fresh = self.predictor.predict(dep.name, ask.streamed, self._features(ask, 0, -1))
        if dep.another_s + fresh >= expected:
            return False
        if dep.name not in self.asked:
            self.metrics.replica_asks.labels(dep.name).inc()
            self._spawn(self._announce_demand(dep.name))
        self.asked[dep.name] = time.monotonic()
        return True

    def _gauge(self, name: str) -> None:
        queue = self.flows.get(name)
        for band, word in enumerate(BANDS):
            self.metrics.flow_waiting.labels(name, word).set(queue.counts[band] if queue is not None else 0)

    def take(self, replica: ReplicaView, holder: tuple[str, str] | None = None) -> None:
        """A slot of `replica` taken, held by `holder` ((deployment, flow)) when given."""
        self.outstanding[replica.id] = self.outstanding.get(replica.id, 0) + 1
        if holder is not None:
            self._hold(holder, 1)

    def _hold(self, holder: tuple[str, str], n: int) -> None:
        self.held[holder] = self.held.get(holder, 0) + n
        if not self.held[holder]:
            del self.held[holder]

    def free(self, name: str, replica: ReplicaView, flow: str | None = None) -> None:
        """A request on `replica` of deployment `name` is over: its slot goes to the next one waiting (and no longer
        counts against `flow`'s share, when given)."""
        self.outstanding[replica.id] -= 1
        if not self.outstanding[replica.id]:
            del self.outstanding[replica.id]
        if flow is not None:
            self._hold((name, flow), -1)
        if self.flows.get(name):  # busy: how often a slot frees is what a wait in its queue is predicted from
            now = time.monotonic()
            last, every = self.freeing.get(name, (0.0, FREE_EVERY_S))
            if last and now - last < 60:
                every = 0.8 * every + 0.2 * (now - last)
            self.freeing[name] = (now, every)
        self._dispatch(name)

    def sending(self, picked: Picked) -> Sent:
        """`picked`'s request goes to its replica now: its uncached prompt joins the replica's prefill backlog until
        Sent.first_byte()."""
        if picked.features is not None:
            rid = picked.replica.id
            self.prefilling[rid] = self.prefilling.get(rid, 0.0) + picked.features.uncached_kb
        return Sent(self, picked, time.monotonic())

    def learn(self, picked: Picked, seconds: float) -> None:
        """`picked`'s request took `seconds` from being sent to its first byte: the predictor learns from it."""
        if picked.features is None:
            return
        self.predictor.learn(picked.deployment, picked.streamed, picked.features, picked.predicted, seconds)
        self.metrics.predicted.labels(picked.deployment).observe(picked.predicted)
        if (mape := self.predictor.mape(picked.deployment)) is not None:
            self.metrics.prediction_error.labels(picked.deployment).set(mape)

    @contextlib.contextmanager
    def in_flight(self, dep: DeploymentView, replica: ReplicaView, taken: bool = False,
                  flow: str | None = None) -> Iterator[Slot]:
        """The request counts against `replica`'s slots (and `flow`'s share) until the block ends (`taken`: acquire()
        counted it), or, where the block sets the slot's `kept` (a stream), until whoever kept it frees it."""
        if not taken:
            self.take(replica, None if flow is None else (dep.name, flow))
        slot = Slot()
        try:
            yield slot
        finally:
            if not slot.kept:
                self.free(dep.name, replica, flow)
            self.book.used(dep.name, replica.id)
