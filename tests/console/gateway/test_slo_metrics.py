"""Requests counted against their deployment's SLO: met within the target without a server-side error, else
missed; deployments without a target are not counted."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from console.catalog.services import register_model
from console.deployments.services import create_deployment
from console.fleet.models import AgentCredential, Host
from console.gateway.metrics import slo_outcome
from tests.console.gateway.test_gateway import INFER, FakeAgent, _client, _gateway, _ready_replica, _token


@pytest.mark.parametrize(("status", "seconds", "outcome"), [
    (200, 0.2, "met"),  # at the target exactly
    (200, 0.201, "missed"),
    (404, 0.01, "met"),  # the client's mistake, answered in time
    (429, 0.01, "missed"),  # turned away for capacity
    (502, 0.01, "missed"),
    (503, 0.01, "missed"),
])
def test_an_answer_meets_the_slo_in_time_and_without_a_server_side_error(status, seconds, outcome):
    assert slo_outcome(200, status, seconds) == outcome


@pytest.fixture
async def h1():
    """Host h1's fake agent, answering its secret: its endpoint."""
    credential, _ = await sync_to_async(AgentCredential.issue)("h1")
    agent = FakeAgent(credential.gateway_secret, "h1")
    yield await agent.start()
    await agent.runner.cleanup()


def _slo(gateway, deployment: str, outcome: str) -> float | None:
    return gateway.metrics.registry.get_sample_value("modelgrid_gateway_slo_requests_total",
                                                     {"deployment": deployment, "outcome": outcome})


@pytest.mark.django_db(transaction=True)
async def test_the_gateway_counts_met_and_missed_requests_per_deployment_with_a_target(model_dir, h1):
    def rows() -> str:
        live = Host.objects.create(name="h1", endpoint=h1, connected=True)
        dead = Host.objects.create(name="h2", endpoint="http://127.0.0.1:9", connected=True)  # nothing listens
        AgentCredential.issue("h2")
        register_model("tiny", str(model_dir))
        # A target far beyond any loopback answer: "met" must not depend on how busy the machine is.
        _ready_replica(create_deployment("chat", "tiny", slo_latency_ms=60_000), 0, live)
        _ready_replica(create_deployment("broken", "tiny", slo_latency_ms=60_000), 0, dead)
        _ready_replica(create_deployment("loose", "tiny"), 0, live)
        return _token()

    token = await sync_to_async(rows)()
    gateway = _gateway()
    try:
        async with _client(gateway, token) as client:
            for name in ("chat", "chat", "broken", "loose"):
                await client.post(f"/v2/models/{name}/infer", json=INFER)
    finally:
        await gateway.close()
    assert (_slo(gateway, "chat", "met"), _slo(gateway, "chat", "missed")) == (2, None)
    # 502: no replica could be reached
    assert (_slo(gateway, "broken", "met"), _slo(gateway, "broken", "missed")) == (None, 1)
    assert (_slo(gateway, "loose", "met"), _slo(gateway, "loose", "missed")) == (None, None)


@pytest.mark.django_db(transaction=True)
async def test_a_refusal_for_the_callers_own_limit_is_no_slo_miss_of_the_deployment(model_dir, h1):
    from console.accounts.models import ApiToken

    def rows() -> str:
        register_model("tiny", str(model_dir))
        host = Host.objects.create(name="h1", endpoint=h1, connected=True)
        _ready_replica(create_deployment("chat", "tiny", slo_latency_ms=60_000), 0, host)
        token = _token()
        ApiToken.objects.filter(prefix=ApiToken.lookup(token).prefix).update(rpm_limit=1)
        return token

    gateway = _gateway()
    async with _client(gateway, await sync_to_async(rows)()) as client:
        statuses = [(await client.post("/v2/models/chat/infer", json=INFER)).status_code for _ in range(3)]
    await gateway.close()
    assert statuses == [200, 429, 429]
    assert (_slo(gateway, "chat", "met"), _slo(gateway, "chat", "missed")) == (1, None)
    requests = gateway.metrics.registry.get_sample_value(
        "modelgrid_gateway_requests_total", {"deployment": "chat", "adapter": "", "code": "429"})
    assert requests == 2  # still counted as requests
