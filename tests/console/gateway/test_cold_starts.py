"""A request for a deployment whose replica is stopped on disk waits for one to start only when its start fits in
the gateway's queue wait: vLLM on CPU cannot sleep, so its idle replica is stopped, and its 59 s start came just
under the 60 s limit (a slower one timed out every waiting request). Past the limit, the request gets 503 with
Retry-After at once, and the start still goes ahead so that the retry finds it."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from console.deployments.models import Deployment, Replica
from tests.console.gateway.test_gateway import _client, _gateway, fleet  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)
COMPLETION = {"model": "chat", "prompt": "hi"}


def stopped(start_seconds: float) -> None:
    """chat's one replica was asked to sleep and stopped instead, its last start measured."""
    Replica.objects.filter(deployment__name="chat", index=1).delete()
    Replica.objects.filter(deployment__name="chat").update(desired_state="sleeping", observed_state="stopped",
                                                           start_seconds=start_seconds)


async def test_a_start_longer_than_the_queue_wait_is_a_503_with_retry_after_at_once_and_still_starts(fleet):  # noqa: F811
    _, _, token = fleet
    await sync_to_async(stopped)(120.0)
    gateway = _gateway(queue_wait_s=60)
    async with _client(gateway, token) as client:
        r = await asyncio.wait_for(client.post("/v1/completions", json=COMPLETION), 5)
        assert r.status_code == 503 and r.headers["retry-after"] == "120"
        assert r.json()["error"]["message"] == (
            "model 'chat' is stopped: a replica takes about 120 s to start (its last start), longer than a request "
            "waits here (60 s); one is starting now: retry after 120 s")
        demand = 0
        for _ in range(100):  # the start goes ahead: the scheduler is told of the demand
            demand = await sync_to_async(lambda: Deployment.objects.get(name="chat").demand)()
            if demand:
                break
            await asyncio.sleep(0.02)
        await gateway.flush()
    await gateway.close()
    assert demand == 1
    # ... and of the request, so the idle rule does not take the replica away again before the retry.
    assert await sync_to_async(lambda: Deployment.objects.get(name="chat").last_request_at)() is not None


async def test_a_start_that_fits_the_queue_wait_is_waited_for(fleet):  # noqa: F811
    _, _, token = fleet
    await sync_to_async(stopped)(0.2)
    gateway = _gateway(queue_wait_s=0.3)
    async with _client(gateway, token) as client:
        r = await client.post("/v1/completions", json=COMPLETION)
    await gateway.close()
    assert r.status_code == 503 and "became ready within 0.3 s" in r.json()["error"]["message"]
