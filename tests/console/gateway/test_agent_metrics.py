"""Prometheus scrapes every agent through the console: /metrics/agents lists them (HTTP service discovery) and
/metrics/agents/NAME relays one agent's /metrics with its host's gateway secret, both behind an API token. The
agents here are the real agent's inference app (agent.serving.app) on loopback, holding their host's secret."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from prometheus_client import CollectorRegistry

from agent.metrics import Metrics
from agent.serving.app import GatewayAuth
from agent.serving.app import make_app as agent_app
from console.accounts.models import ApiToken, Scope
from console.asgi import django_asgi_app
from console.fleet.models import AgentCredential, Host
from console.gateway.app import make_app
from console.gateway.core import Gateway
from console.gateway.metrics import ConsoleMetrics
from console.gateway.mount import GatewayPaths

pytestmark = pytest.mark.django_db(transaction=True)


class NoReplicas:
    def handles(self) -> list:
        return []


async def _agent(secret: str, deployment: str) -> tuple[web.AppRunner, str, list[str]]:
    """The real agent inference app with one answered request of `deployment` in its metrics; the third value
    lists the paths it was asked for."""
    metrics = Metrics(CollectorRegistry())
    metrics.request_started(deployment)
    metrics.request_finished(deployment, None, 200, 0.01)
    app = agent_app(NoReplicas(), metrics=metrics, auth=GatewayAuth(secret))
    asked: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler):
        asked.append(request.path)
        return await handler(request)

    app.middlewares.insert(0, record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", asked


@pytest.fixture
async def agents():
    """Hosts h1 and h2, each the real agent app with its own secret; h3 has no endpoint yet. Yields the
    recorded paths by host, an API token, and a client factory for the console's routes."""
    runners, asked = [], {}
    for name in ("h1", "h2"):
        credential, _ = await sync_to_async(AgentCredential.issue)(name)
        runner, endpoint, asked[name] = await _agent(credential.gateway_secret, f"dep-{name}")
        runners.append(runner)
        await sync_to_async(Host.objects.create)(name=name, endpoint=endpoint, connected=True)
    await sync_to_async(Host.objects.create)(name="h3", endpoint="", connected=False)

    def token() -> str:  # Prometheus scraping the whole fleet: an admin's token (a member's reads its teams' only)
        user, _ = get_user_model().objects.get_or_create(username="prometheus", is_staff=True)
        return ApiToken.issue(user, scope=Scope.INFERENCE)[1]

    gateway = Gateway(metrics=ConsoleMetrics())
    routes = GatewayPaths(gateway=make_app(gateway), django=django_asgi_app)  # the console's routing (asgi.py)

    def client(token: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(transport=httpx.ASGITransport(routes), base_url="http://console.example:8000",
                                 headers=headers, timeout=10)

    yield asked, await sync_to_async(token)(), client
    await gateway.close()
    for runner in runners:
        await runner.cleanup()


async def test_an_agents_metrics_reach_prometheus_through_the_console_with_its_hosts_secret(agents):
    asked, token, _client = agents
    async with _client(token) as client:
        h1 = await client.get("/metrics/agents/h1")
        h2 = await client.get("/metrics/agents/h2")
    # Each body is that agent's own (the agent answers only its host's secret: 401 otherwise).
    assert h1.status_code == 200, h1.text
    assert 'modelgrid_requests_total{adapter="",deployment="dep-h1",status="200"} 1.0' in h1.text
    assert "dep-h2" not in h1.text
    assert 'modelgrid_requests_total{adapter="",deployment="dep-h2",status="200"} 1.0' in h2.text
    assert h1.headers["content-type"].startswith("text/plain")
    assert asked == {"h1": ["/metrics"], "h2": ["/metrics"]}


async def test_discovery_lists_every_host_with_an_endpoint_as_a_target_on_this_console(agents):
    _, token, _client = agents
    async with _client(token) as client:
        r = await client.get("/metrics/agents")
    assert r.status_code == 200, r.text
    assert r.json() == [
        {"targets": ["console.example:8000"],
         "labels": {"__metrics_path__": f"/metrics/agents/{name}", "instance": name, "host": name,
                    "__scheme__": "http"}}
        for name in ("h1", "h2")
    ]


async def test_without_a_token_neither_answers_and_no_agent_is_asked(agents):
    asked, _, _client = agents
    async with _client() as client:
        listing = await client.get("/metrics/agents")
        relayed = await client.get("/metrics/agents/h1")
    async with _client("not-a-token") as client:
        wrong = await client.get("/metrics/agents/h1")
    assert [listing.status_code, relayed.status_code, wrong.status_code] == [401, 401, 401]
    assert asked == {"h1": [], "h2": []}


async def test_an_unknown_host_an_endpointless_one_and_an_unreachable_one_are_refused_by_name(agents):
    _, token, _client = agents
    await sync_to_async(Host.objects.filter(name="h2").update)(endpoint="http://127.0.0.1:9")  # nothing listens
    async with _client(token) as client:
        unknown = await client.get("/metrics/agents/nope")
        no_endpoint = await client.get("/metrics/agents/h3")
        unreachable = await client.get("/metrics/agents/h2")
    assert unknown.status_code == 404 and "no host named 'nope'" in unknown.json()["error"]
    assert no_endpoint.status_code == 503 and "h3" in no_endpoint.json()["error"]
    assert "no inference endpoint" in no_endpoint.json()["error"]
    assert unreachable.status_code == 502
    assert "h2" in unreachable.json()["error"] and "127.0.0.1:9" in unreachable.json()["error"]


async def test_an_endpoint_with_more_than_a_scheme_host_and_port_is_never_fetched(agents):
    # Stored as an older console took it from an agent's hello: the relay would have fetched
    # http://127.0.0.1:PORT/v2/health/live?/metrics, any loopback URL of the agent token holder's choosing.
    asked, token, _client = agents
    base = await sync_to_async(lambda: Host.objects.get(name="h1").endpoint)()
    for tail in ("/v2/health/live?", "/private", "?x=", "#", "/metrics#"):
        await sync_to_async(Host.objects.filter(name="h1").update)(endpoint=base + tail)
        async with _client(token) as client:
            r = await client.get("/metrics/agents/h1")
        assert r.status_code == 503, (tail, r.text)
        assert "scheme://host:port" in r.json()["error"] and "h1" in r.json()["error"]
    await sync_to_async(Host.objects.filter(name="h1").update)(endpoint=base.replace("http://", "http://u:p@"))
    async with _client(token) as client:
        assert (await client.get("/metrics/agents/h1")).status_code == 503
    assert asked["h1"] == []
