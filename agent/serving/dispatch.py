"""From a model name to an answer: deployment or adapter lookup, the least busy ready replica, its batcher,
and the metrics each request leaves. Shared by the v2 and OpenAI-style endpoints, which only shape errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from agent import engines
from agent.engines import Engine
from agent.metrics import Metrics
from agent.protocol import REPLICA_HEADER, RESTING  # noqa: F401  (agent.serving.app imports RESTING from here)
from agent.serving.batching import Batcher, BatcherClosed, BatchSettings, InvalidInput, QueueFull, Result, RunBatch
from agent.serving.tensors import BadRequest
from agent.workers.errors import (
    InferenceInputError,
    InferenceOutOfMemory,
    InferenceTimeout,
    WorkerUnavailable,
)
from agent.workers.generation_spec import GenerationRequest, Token
from agent.workers.spec import WorkerSpec

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # the client went away before its answer (nginx's convention)


class Replica(Protocol):
    """What serving needs of a worker (the supervisor's WorkerHandle; tests pass fakes)."""

    spec: WorkerSpec
    state: str
    reason: str
    info: dict[str, Any]  # what the worker reported when ready: output_dim, max_positions, ...
    queued: int  # batches waiting or running in the worker
    adapters: Collection[str]  # names of the LoRA adapters this replica can serve
    # Optional (fakes may lack it): adapter -> why its worker could not load it (WorkerHandle.adapter_failures).
    adapter_failures: Mapping[str, str]

    async def infer(
        self, inputs: dict[str, np.ndarray], adapters: list[str | None] | None = None
    ) -> dict[str, np.ndarray]:
        """One forward over a batch; `adapters` names each row's adapter (None: the base model)."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[Token]:
        """Start one sequence in the worker's continuous batcher (causal LMs): its tokens as they come, then
        `.result` (a GenerationResult); `.close()` cancels it."""
        ...


class ReplicaSource(Protocol):
    """Where the replicas come from (the Agent; a Supervisor or a fake in tests). Serving only reads them:
    it never wakes, loads or promotes one (the console's desired state alone decides that)."""

    def handles(self) -> list[Any]: ...


class ServingError(Exception):
    """A request that cannot be answered: an HTTP status, a stable code, and a message that says why."""

    status = 500
    code = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class BadInput(ServingError):
    status, code = 400, "invalid_request"


class UnknownModel(ServingError):
    status, code = 404, "model_not_found"


class Busy(ServingError):
    status, code = 429, "queue_full"


class NotReady(ServingError):
    status, code = 503, "model_not_ready"
    unserved = False  # True: refused before any replica here acted on it (another replica may take it)


class NoneServing(NotReady):
    """No replica of the model here serves now (sleeping, preloaded, draining, loading): nothing was started."""

    unserved = True


class AdapterFailed(ServingError):
    """The adapter asked for could not be loaded on any replica that serves it: the server's failure, not the
    client's, and not one that passes by waiting (its files or its rank must change)."""

    status, code = 503, "adapter_failed"


class OutOfMemory(ServingError):
    status, code = 507, "insufficient_memory"


class Timeout(ServingError):
    status, code = 504, "timeout"


class Failed(ServingError):
    status, code = 500, "inference_failed"


def serving_error(error: BaseException, name: str) -> ServingError:
    """Any failure while serving model `name` as the ServingError the client is told about."""
    if isinstance(error, ServingError):
        return error
    if isinstance(error, BadRequest | InvalidInput | InferenceInputError):
        return BadInput(str(error))
    if isinstance(error, QueueFull):
        return Busy(f"model {name!r}: {error}")
    if isinstance(error, InferenceOutOfMemory):
        return OutOfMemory(f"model {name!r} cannot take this request: {error}")
    if isinstance(error, WorkerUnavailable | BatcherClosed):
        return NotReady(f"model {name!r} is not ready: {error}")
    if isinstance(error, InferenceTimeout):
        return Timeout(str(error))
    return Failed(f"inference failed: {error}")


@dataclass(frozen=True)
class Route:
    """Where a model name leads: a deployment's replicas, and the adapter they run it with."""

    name: str  # as the client wrote it
    deployment: str
    adapter: str | None
    replicas: tuple[Any, ...]

    @property
    def task(self) -> str:
        return self.replicas[0].spec.task


@dataclass
class Observation:
    """What metrics record of one request; the handler fills in what it learns."""

    deployment: str
    adapter: str | None
    status: int = 200
    queue_seconds: float | None = None
    batch_size: int | None = None

    def record(self, result: Result) -> None:
        self.queue_seconds = max(self.queue_seconds or 0.0, result.queue_seconds)
        self.batch_size = max(self.batch_size or 0, result.batch_size)


class Dispatcher:
    """Routes requests to the replicas of `source`, through one Batcher per replica."""

    def __init__(self, source: ReplicaSource, batching: BatchSettings, metrics: Metrics | None = None) -> None:
        self.source = source
        self.batching = batching
        self.metrics = metrics
        self._batchers: dict[Any, Batcher] = {}

    def route(self, name: str, adapter: str | None = None, replica_id: int | None = None) -> Route:
        """A deployment name (optionally with one of its adapters) or an adapter's own name; with `replica_id`
        (the replica the console's gateway picked: it routes once), that replica alone. AdapterFailed, with the
        worker's reason, when the adapter could not be loaded on any of them."""
        return _loaded(only(self._route(name, adapter), replica_id))

    def _route(self, name: str, adapter: str | None) -> Route:
        handles = self.source.handles()
        self._forget_gone(handles)
        replicas = [h for h in handles if h.spec.deployment == name]
        if replicas:
            if adapter is None:
                return Route(name, name, None, tuple(replicas))
            with_adapter = [h for h in replicas if adapter in h.adapters]
            if not with_adapter:
                have = sorted({a for h in replicas for a in h.adapters})
                listed = f" (it has: {', '.join(have)})" if have else " (it has none)"
                raise UnknownModel(f"model {name!r} has no adapter {adapter!r}{listed}", code="adapter_not_found")
            return Route(name, name, adapter, tuple(with_adapter))
        owners = sorted({h.spec.deployment for h in handles if name in h.adapters})
        if len(owners) > 1:
            raise BadInput(f"adapter {name!r} belongs to several models ({', '.join(owners)}); name the model")
        if not owners:
            served = sorted({h.spec.deployment for h in handles} | {a for h in handles for a in h.adapters})
            listed = f" (it serves: {', '.join(served)})" if served else " (it serves no models right now)"
            raise UnknownModel(f"model {name!r} is not served by this agent{listed}")
        if adapter not in (None, name):
            raise BadInput(f"model {name!r} is an adapter; it cannot take adapter {adapter!r} too")
        return Route(name, owners[0], name, tuple(h for h in handles if name in h.adapters))

    def models(self) -> list[tuple[str, str | None]]:
        """Every name a request may use: (deployment, None) and (adapter, its deployment)."""
        handles = self.source.handles()
        deployments = sorted({h.spec.deployment for h in handles})
        adapters = sorted({(a, h.spec.deployment) for h in handles for a in h.adapters})
        return [(d, None) for d in deployments] + [(a, d) for a, d in adapters if a not in deployments]

    def check(self, route: Route) -> None:
        """NotReady, saying which replica is in which state and why, when no replica of the route serves."""
        if not any(serves(h) for h in route.replicas):
            raise NoneServing(not_ready_text(route.name, route.replicas))

    async def pick(self, route: Route) -> Any:
        """The ready replica with the least work queued; NotReady at once, saying why, when none is (a
        sleeping or preloaded replica is not woken or promoted for a request: the console decides that; a
        draining one finishes what it has and takes nothing new)."""
        ready = [h for h in route.replicas if serves(h)]
        if ready:
            return min(ready, key=lambda h: h.queued + self._depth(h))
        raise NoneServing(not_ready_text(route.name, route.replicas))

    async def infer(self, route: Route, inputs: dict[str, np.ndarray]) -> Result:
        """One request through the picked replica's batcher."""
        replica = await self.pick(route)
        batcher = self._batchers.get(replica)
        settings = self.settings_for(replica)
        if batcher is not None and batcher.settings != settings and not batcher.depth:
            # The deployment's batching changed; swapped only while idle, so no queued request is dropped.
            self._batchers.pop(replica).close()
            batcher = None
        if batcher is None:
            batcher = self._batchers[replica] = Batcher.from_settings(_forward(replica), settings)
        counted = hasattr(replica, "picked")  # counted until answered, so a drain waits for it
        if counted:
            replica.picked += 1
        try:
            return await batcher.submit(inputs, route.adapter)
        finally:
            if counted:
                replica.picked -= 1

    def settings_for(self, replica: Any) -> BatchSettings:
        """A replica's batching: its deployment's when the console sent it, else the agent's default."""
        return getattr(replica, "batching", None) or self.batching

    async def generate(self, route: Route, request: GenerationRequest) -> AsyncIterator[Token]:
        """One sequence started in the picked replica's continuous batcher; iterate it for its tokens
        (agent.workers.handle.GenerationStream), close it to cancel."""
        replica = await self.pick(route)
        return replica.generate(request)

    @contextmanager
    def observe(self, route: Route) -> Iterator[Observation]:
        """Count the request as in flight, then record its status and timings, whatever happens; any
        failure inside leaves as a ServingError."""
        seen = Observation(route.deployment, route.adapter)
        started = time.monotonic()
        if self.metrics is not None:
            self.metrics.request_started(route.deployment)
        try:
            yield seen
        except (asyncio.CancelledError, ConnectionResetError):  # the client went away (mid-stream: a failed write)
            seen.status = CLIENT_CLOSED
            raise
        except Exception as e:
            failure = serving_error(e, route.name)
            seen.status = failure.status
            if failure is not e:
                if failure.status >= 500 and not isinstance(failure, NotReady | Timeout):
                    log.exception("inference on %s failed", route.name)
                raise failure from e
            raise
        finally:
            if self.metrics is not None:
                self.metrics.request_finished(
                    seen.deployment,
                    seen.adapter,
                    seen.status,
                    time.monotonic() - started,
                    seen.queue_seconds,
                    seen.batch_size,
                )

    def close(self) -> None:
        """Stop every batcher (the server is shutting down)."""
        for batcher in self._batchers.values():
            batcher.close()
        self._batchers.clear()

    def _depth(self, replica: Any) -> int:
        batcher = self._batchers.get(replica)
        return batcher.depth if batcher is not None else 0

    def _forget_gone(self, handles: list[Any]) -> None:
        # A stopped replica's handle leaves the source; its batcher goes with it.
        if any(h not in handles for h in self._batchers):
            for handle in [h for h in self._batchers if h not in handles]:
                self._batchers.pop(handle).close()


def _loaded(route: Route) -> Route:
    """`route` without the replicas whose worker could not load its adapter; AdapterFailed when none is left."""
    if route.adapter is None:
        return route
    failed = {id(h): why for h in route.replicas
              if (why := getattr(h, "adapter_failures", {}).get(route.adapter)) is not None}
    if not failed:
        return route
    if len(failed) == len(route.replicas):
        raise AdapterFailed(f"adapter {route.adapter!r} of model {route.deployment!r} could not be loaded: "
                            f"{next(iter(failed.values()))}")
    return replace(route, replicas=tuple(h for h in route.replicas if id(h) not in failed))


def only(route: Route, replica_id: int | None) -> Route:
    """`route` narrowed to one replica; NoneServing (another replica may take the request) when this agent has
    no such replica of the model."""
    if replica_id is None:
        return route
    picked = tuple(h for h in route.replicas if h.spec.replica_id == replica_id)
    if not picked:
        raise NoneServing(f"model {route.name!r} has no replica {replica_id} on this agent (it has: "
                          f"{', '.join(str(h.spec.replica_id) for h in route.replicas) or 'none'})")
    return replace(route, replicas=picked)


def picked_replica(request: web.Request) -> int | None:
    """The replica the gateway picked for this request (REPLICA_HEADER); None when it names none."""
    value = request.headers.get(REPLICA_HEADER)
    if value is None:
        return None
    if not value.isdigit() or len(value) > 18:
        raise BadInput(f"{REPLICA_HEADER} must be a replica's id (digits), not {value[:40]!r}")
    return int(value)


def engine_of(handle: Any) -> Engine:
    """The engine a replica runs on (fakes without one run the built-in one)."""
    return engines.get(getattr(handle.spec, "engine", None))


def relays_bodies(route: Route) -> bool:
    """Whether the route's replicas run on an engine whose server takes OpenAI bodies as they came."""
    return any(engine_of(h).passes_openai_bodies for h in route.replicas)


def _forward(replica: Any) -> RunBatch:
    async def run(inputs: dict[str, np.ndarray], adapters: list[str | None]) -> dict[str, np.ndarray]:
        if any(a is not None for a in adapters):
            return await replica.infer(inputs, adapters=adapters)
        return await replica.infer(inputs)  # the plain call, which every replica takes

    return run


def serves(handle: Any) -> bool:
    """Whether a replica takes new requests: ready and not draining."""
    return handle.state == "ready" and not getattr(handle, "draining", False)


def describe(handle: Any) -> str:
    state = "draining (it is leaving this host)" if handle.state == "ready" and getattr(handle, "draining", False) \
        else handle.state
    text = f"replica {handle.spec.replica_id} of {handle.spec.deployment!r} is {state}"
    return f"{text}: {handle.reason}" if handle.reason else text


def not_ready_text(name: str, replicas: Collection[Any]) -> str:
    return f"model {name!r} is not ready: " + "; ".join(describe(h) for h in replicas)


DISPATCHER = web.AppKey("dispatcher", Dispatcher)
