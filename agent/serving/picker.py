"""What an endpoint picker scrapes: the Model Server Protocol's metrics (agent.msp) of this host's replicas.

A picker (the Gateway API inference extension's EPP, llm-d's) scrapes one page per endpoint, an address and a
port, at one path it is configured with. On an agent that endpoint is the agent's port, so the page is per
deployment: `GET /msp/{deployment}/metrics` gives its serving replicas here as one (the agent picks among them),
and `GET /msp/{deployment}/{index}/metrics` one replica's own, for a picker that can address replicas apart.
The built-in engine's figures are the worker's; vLLM's and llama.cpp's are read from their servers at each scrape.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from agent.metrics import CONTENT_TYPE
from agent.msp import EndpointLoad, builtin_load, combine, llamacpp_load, render, vllm_load
from agent.serving.dispatch import DISPATCHER, describe, engine_of, serves
from agent.serving.engine_metrics import scrape
from agent.serving.relay import SESSION

PATH_PREFIX = "/msp/"  # every route here (agent.serving.auth opens them to a picker only when told to)
PARSERS = {"vllm": vllm_load, "llamacpp": llamacpp_load}  # engines whose servers are scraped, by engine name


def add_picker_routes(app: web.Application) -> None:
    app.router.add_get(PATH_PREFIX + "{deployment}/metrics", deployment_metrics)
    app.router.add_get(PATH_PREFIX + "{deployment}/{index:\\d{1,9}}/metrics", replica_metrics)


async def deployment_metrics(request: web.Request) -> web.Response:
    """The deployment's serving replicas on this host, as one endpoint."""
    name = request.match_info["deployment"]
    return await _answer(request, name, _replicas(request, name))


async def replica_metrics(request: web.Request) -> web.Response:
    """One replica, by its index among the deployment's replicas (the `#0` of `chat#0`)."""
    name, index = request.match_info["deployment"], int(request.match_info["index"])
    return await _answer(request, name, [h for h in _replicas(request, name) if h.spec.index == index])


async def endpoint_load(session: aiohttp.ClientSession, name: str, handles: list[Any]) -> EndpointLoad | None:
    """The figures of `handles` (serving replicas of deployment `name`) as one endpoint; None when none of them
    could be read (an engine server that did not answer this scrape is left out)."""
    loads = await asyncio.gather(*(_load(session, h) for h in handles))
    known = [load for load in loads if load is not None]
    return combine(name, known) if known else None


async def _load(session: aiohttp.ClientSession, handle: Any) -> EndpointLoad | None:
    parse = PARSERS.get(engine_of(handle).name)
    if parse is None:
        return builtin_load(handle)
    text = await scrape(session, handle) if "port" in handle.info else ""
    return await asyncio.to_thread(parse, handle.spec.deployment, text) if text else None


async def _answer(request: web.Request, name: str, handles: list[Any]) -> web.Response:
    serving = [h for h in handles if serves(h)]
    if not serving:
        # Not 200: a picker keeps its last figures and an error for this endpoint, rather than read it as idle.
        why = "; ".join(describe(h) for h in handles) or "it has no replica on this host"
        return web.json_response({"error": f"model {name!r} is not served here now: {why}"}, status=503)
    load = await endpoint_load(request.app[SESSION], name, serving)
    if load is None:
        return web.json_response({"error": f"model {name!r}: its engine servers did not answer"}, status=503)
    return web.Response(body=render(load), headers={"Content-Type": CONTENT_TYPE})


def _replicas(request: web.Request, name: str) -> list[Any]:
    return [h for h in request.app[DISPATCHER].source.handles() if h.spec.deployment == name]
