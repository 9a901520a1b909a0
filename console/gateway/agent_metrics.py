"""Every agent's /metrics through the console, for Prometheus: one scrape job and one API token for the whole
fleet. An agent's inference port answers only its host's gateway secret (agent/serving/auth.py), which is
derived per host and stored nowhere an operator could copy it from; so the console, which holds every secret,
relays each agent's page, and lists the agents in Prometheus's HTTP service discovery format.

GET /metrics/agents       [{"targets": ["<this console>"], "labels": {"__metrics_path__": "/metrics/agents/h1",
                            "instance": "h1", "host": "h1", "__scheme__": "http"}}, ...]
GET /metrics/agents/NAME  that agent's /metrics, as it answered
"""

from __future__ import annotations

import asyncio

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agent.protocol.messages import ENDPOINT_FORM, endpoint_parts
from console.gateway.core import Gateway, Refused
from console.gateway.metrics import CONTENT_TYPE
from console.gateway.metrics_scope import scoped, visible
from console.gateway.upstream import Unreachable

# Prometheus's own scrape timeout is 10 s by default; an agent that has not answered by then is down to it anyway.
SCRAPE_TIMEOUT_S = 8.0
QUOTED_BYTES = 300  # of an agent's refusal, in ours


async def targets(gw: Gateway, request: Request) -> Response:
    """Each host with an inference endpoint, as a target on this console: its `instance` is the host's name, so
    the agents' series stay apart although Prometheus reaches them all at one address."""
    here = request.headers.get("host") or request.url.netloc
    return JSONResponse([
        {"targets": [here], "labels": {"__metrics_path__": f"/metrics/agents/{name}", "instance": name, "host": name,
                                       "__scheme__": request.url.scheme}}
        for name, host in sorted(gw.fleet.hosts.items()) if host.endpoint
    ])


async def relay(gw: Gateway, request: Request) -> Response:
    name = request.path_params["name"]
    host = gw.fleet.hosts.get(name)
    if host is None:
        raise Refused(404, f"no host named {name!r} (GET /metrics/agents lists them)", code="unknown_host")
    if not host.endpoint:
        raise Refused(503, f"host {name!r} has no inference endpoint yet: its agent has not connected since it was "
                      "added", code="no_endpoint")
    try:
        # Rebuilt from its parts: whatever else a stored endpoint carries (a path, a query: an older console took
        # them) must not choose what is fetched.
        scheme, address, port = endpoint_parts(host.endpoint)
    except ValueError:
        raise Refused(503, f"host {name!r} advertises the endpoint {host.endpoint[:100]!r}, which is not "
                      f"{ENDPOINT_FORM}; it is not fetched until its agent says hello with one that is",
                      code="bad_endpoint") from None
    base = f"{scheme}://{address}:{port}"
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            response = await gw.upstream.request(base, host.secret, f"host {name!r}", "GET", "/metrics")
            async with response:
                body = await response.read()
    except (Unreachable, TimeoutError, aiohttp.ClientError) as e:
        detail = str(e) if isinstance(e, Unreachable) else f"host {name!r} at {base}: {e or type(e).__name__}"
        raise Refused(502, f"agent unreachable: {detail}", code="agent_unreachable") from e
    if response.status != 200:
        said = body[:QUOTED_BYTES].decode("utf-8", "replace")
        raise Refused(502, f"host {name!r}'s agent answered {response.status} to its metrics scrape: {said}",
                      code="agent_refused")
    names = visible(request.state.caller, gw.fleet)
    if names is not None:  # a member's token: other teams' replicas on this (shared) host left out
        body = await asyncio.to_thread(scoped, body, names)
    return Response(body, headers={"Content-Type": response.headers.get("Content-Type", CONTENT_TYPE)})
