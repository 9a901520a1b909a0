"""Flow control and predicted time to first token through the gateway, against real rows and fake agents on loopback:
who gets a replica's next free slot, what is shed, how long anything waits, and when another replica is asked for."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken
from console.deployments.models import Deployment, Replica
from tests.console.gateway.test_gateway import _client, _gateway, fleet  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _shared_order(agents, delay: float = 1.0) -> list:
    """Both agents record into one list: the order requests reached any replica. Each answer takes `delay`: long
    enough that what the test sends next arrives while the first two hold the slots, on a loaded machine too."""
    order = []
    for agent in agents:
        agent.seen = order
        agent.delay = delay
    return order


def _second_token() -> str:
    return ApiToken.issue(get_user_model().objects.get(username="client"))[1]


def _prompt(body: bytes) -> str:
    import json

    return json.loads(body)["prompt"]


async def _post(client, prompt: str, criticality: str | None = None, token: str | None = None):
    headers = {"x-modelgrid-criticality": criticality} if criticality else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return await client.post("/v1/completions", json={"model": "chat", "prompt": prompt}, headers=headers)


async def _sending(client, order: list, label: str, n: int, reached: int, criticality: str | None = None) -> list:
    """`n` requests (prompts label0, label1, ...) sent in the background, once `reached` requests reached replicas."""
    tasks = [asyncio.create_task(_post(client, f"{label}{i}", criticality)) for i in range(n)]
    while len(order) < reached:
        await asyncio.sleep(0.01)
    return tasks


async def test_a_second_tokens_request_goes_before_a_floods_backlog(fleet):  # noqa: F811
    agents, _, token = fleet
    other = await sync_to_async(_second_token)()
    order = _shared_order(agents)
    gateway = _gateway(replica_slots=1)
    async with _client(gateway, token) as client:
        flood = await _sending(client, order, "A", 8, 2)  # both slots taken by the flood; six of it wait
        mine = await _post(client, "B", token=other)
        answers = await asyncio.gather(*flood)
    await gateway.close()
    assert mine.status_code == 200 and all(r.status_code == 200 for r in answers)
    prompts = [_prompt(body) for _, body in order]
    assert prompts.index("B") <= 3, prompts  # at the next free slot, not behind the flood's six
    assert not gateway.flows and not gateway.granted and not gateway.outstanding


async def test_critical_requests_go_first_and_a_sheddable_one_is_refused_429_saturated(fleet):  # noqa: F811
    agents, _, token = fleet
    order = _shared_order(agents)
    gateway = _gateway(replica_slots=1)
    async with _client(gateway, token) as client:
        busy = await _sending(client, order, "S", 5, 2, "standard")
        await asyncio.sleep(0.05)  # the other three standard ones wait
        shed = await _post(client, "shed", "sheddable")
        critical = asyncio.create_task(_post(client, "C", "critical"))
        answers = await asyncio.gather(*busy, critical)
    await gateway.close()
    assert all(r.status_code == 200 for r in answers)
    assert answers[-1].headers["x-modelgrid-criticality"] == "critical"
    assert shed.status_code == 429 and shed.json()["error"]["code"] == "saturated"
    assert "saturated" in shed.json()["error"]["message"] and int(shed.headers["Retry-After"]) >= 1
    prompts = [_prompt(body) for _, body in order]
    assert "shed" not in prompts and prompts.index("C") <= 3, prompts  # ahead of the standard ones that waited
    assert gateway.metrics.shed.labels("chat", "sheddable", "busy")._value.get() == 1


async def test_a_sheddable_request_waits_when_the_predicted_wait_meets_the_slo(fleet):  # noqa: F811
    agents, _, token = fleet
    await sync_to_async(Deployment.objects.filter(name="chat").update)(slo_latency_ms=60_000)
    order = _shared_order(agents, delay=3.0)
    gateway = _gateway(replica_slots=1)
    async with _client(gateway, token) as client:
        busy = await _sending(client, order, "S", 2, 2)
        waited = await _post(client, "shed", "sheddable")
        await asyncio.gather(*busy)
    await gateway.close()
    assert waited.status_code == 200 and float(waited.headers["x-modelgrid-queue-ms"]) > 0


async def test_a_criticality_that_is_no_band_is_refused_400_and_nothing_is_counted(fleet):  # noqa: F811
    agents, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        r = await _post(client, "hi", "urgent")
    await gateway.close()
    assert r.status_code == 400 and "critical, standard, sheddable" in r.json()["error"]["message"]
    assert not any(a.seen for a in agents) and not gateway.per_token and not gateway.outstanding


async def test_a_wait_for_a_slot_is_bounded(fleet):  # noqa: F811
    agents, _, token = fleet
    for agent in agents:
        agent.delay = 1.5
    gateway = _gateway(replica_slots=1, queue_wait_s=0.2)
    async with _client(gateway, token) as client:
        answers = await asyncio.gather(*(_post(client, f"P{i}") for i in range(3)))
    await gateway.close()
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 200, 503], codes
    late = next(r for r in answers if r.status_code == 503)
    assert late.json()["error"]["code"] == "saturated" and "Retry-After" in late.headers
    assert not gateway.flows and not gateway.granted and not gateway.outstanding


async def test_a_request_that_leaves_while_it_waits_gives_its_place_up(fleet):  # noqa: F811
    gateway = _gateway(replica_slots=1)
    await gateway.ensure_started()
    dep = gateway.fleet.deployments["chat"]
    held = [gateway.acquire_now(dep, None), gateway.acquire_now(dep, None)]
    waiting = asyncio.create_task(gateway.acquire(dep, None))
    await asyncio.sleep(0.05)
    assert len(gateway.flows["chat"]) == 1
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert not gateway.flows
    nxt = asyncio.create_task(gateway.acquire(dep, None))
    await asyncio.sleep(0.05)
    gateway.free("chat", held[0].replica)  # its slot goes to the one still waiting
    picked = await asyncio.wait_for(nxt, 5)
    assert picked.replica == held[0].replica and not gateway.granted
    for p in (held[1], picked):
        gateway.free("chat", p.replica)
    await gateway.close()
    assert not gateway.outstanding


async def test_answers_say_the_prediction_and_the_predictor_learns_its_error(fleet):  # noqa: F811
    _, _, token = fleet
    gateway = _gateway()
    async with _client(gateway, token) as client:
        answers = [await _post(client, "x" * 600) for _ in range(5)]
        streamed = await client.post("/v1/chat/completions", json={"model": "chat", "stream": True, "messages": [
            {"role": "user", "content": "hi"}]})
    await gateway.close()
    assert all(float(r.headers["x-modelgrid-predicted-ttft-ms"]) > 0 for r in answers)
    assert streamed.status_code == 200 and "x-modelgrid-predicted-ttft-ms" in streamed.headers
    assert gateway.predictor.mape("chat") is not None
    assert b"modelgrid_gateway_ttft_prediction_mape{deployment=\"chat\"}" in gateway.metrics.render()


def _asleep_third_replica(seconds: float) -> None:
    dep = Deployment.objects.get(name="chat")
    dep.max_replicas = 3
    dep.save(update_fields=["max_replicas"])
    Replica.objects.create(deployment=dep, index=2, desired_state="sleeping", observed_state="sleeping",
                           sleep_wake={"direction": "sleep", "bytes": 1, "seconds": seconds})


async def test_when_waking_a_sleeping_replica_beats_the_queue_the_scheduler_is_asked_for_it(fleet):  # noqa: F811
    _, _, token = fleet
    await sync_to_async(_asleep_third_replica)(0.01)
    gateway = _gateway()
    await gateway.ensure_started()
    dep = gateway.fleet.deployments["chat"]
    assert dep.another_s == 0.01
    async with _client(gateway, token) as client:
        calm = await _post(client, "hi")
        for replica in dep.ready:  # both busy: a request now would wait behind 20 others on either
            gateway.outstanding[replica.id] = 20
        busy = await _post(client, "hi")
        for replica in dep.ready:
            gateway.outstanding[replica.id] -= 20
    await gateway.flush()
    await gateway.close()
    assert "asked" not in calm.headers["x-modelgrid-routing"]
    assert busy.headers["x-modelgrid-routing"].endswith("; asked for another replica")
    assert (await sync_to_async(Deployment.objects.get)(name="chat")).demand >= 1
    assert gateway.metrics.replica_asks.labels("chat")._value.get() == 1


async def test_a_replicas_prefill_backlog_counts_what_was_sent_until_its_first_byte(fleet):  # noqa: F811
    agents, _, token = fleet
    for agent in agents:
        agent.delay = 1.0
    gateway = _gateway(queue_wait_s=0.5)
    async with _client(gateway, token) as client:
        pending = [asyncio.create_task(_post(client, "y" * 2048)) for _ in range(2)]
        while sum(len(a.seen) for a in agents) < 2:
            await asyncio.sleep(0.01)
        during = dict(gateway.prefilling)
        answers = await asyncio.gather(*pending)
        for agent in agents:
            agent.delay = 0.0
            await agent.runner.cleanup()  # gone: a request that reaches no replica leaves the backlog too
        failed = await _post(client, "z" * 2048)
    await gateway.close()
    assert all(r.status_code == 200 for r in answers) and failed.status_code >= 500
    assert sorted(during.values()) == [2.0, 2.0]  # each body's prompt, as the token limits bound it (here: the context)
    assert not gateway.prefilling


async def test_a_waiting_sheddable_request_is_shed_429_once_its_slo_would_be_broken(fleet):  # noqa: F811
    agents, _, token = fleet
    await sync_to_async(Deployment.objects.filter(name="chat").update)(slo_latency_ms=1500)
    order = _shared_order(agents, delay=5.0)
    gateway = _gateway(replica_slots=1)
    async with _client(gateway, token) as client:
        busy = await _sending(client, order, "S", 2, 2)
        shed = await _post(client, "shed", "sheddable")  # predicted within 1.5 s at first; the slots are held 5 s
        await asyncio.gather(*busy)
    await gateway.close()
    assert shed.status_code == 429 and shed.json()["error"]["code"] == "saturated", shed.text
    assert "SLO" in shed.json()["error"]["message"] and "Retry-After" in shed.headers
    assert sorted(_prompt(body) for _, body in order) == ["S0", "S1"]  # it never reached a replica
    assert gateway.metrics.shed.labels("chat", "sheddable", "over_slo")._value.get() == 1
    assert not gateway.flows and not gateway.granted


async def test_a_request_that_asked_for_another_replica_while_it_waited_says_so(fleet):  # noqa: F811
    await sync_to_async(_asleep_third_replica)(0.01)
    gateway = _gateway(replica_slots=1)
    await gateway.ensure_started()
    dep = gateway.fleet.deployments["chat"]
    held = [gateway.acquire_now(dep, None), gateway.acquire_now(dep, None)]
    waiting = asyncio.create_task(gateway.acquire(dep, None))
    await asyncio.sleep(0.05)
    gateway.free("chat", held[0].replica)
    picked = await asyncio.wait_for(waiting, 5)
    for p in (held[1], picked):
        gateway.free("chat", p.replica)
    await gateway.close()
    assert picked.reason.endswith("; asked for another replica"), picked.reason


async def test_while_another_key_is_active_one_key_holds_at_most_its_share_of_the_slots(fleet):  # noqa: F811
    agents, _, token = fleet
    other = await sync_to_async(_second_token)()
    order = _shared_order(agents)
    gateway = _gateway(replica_slots=2)  # 4 slots over the two replicas
    async with _client(gateway, token) as client:
        first = await _post(client, "B0", token=other)  # B was active a moment ago
        flood = await _sending(client, order, "A", 6, 3)
        await asyncio.sleep(0.1)
        during = len(order)  # A holds 2 of the 4 slots, its share while B is active; 2 stay free for B
        mine = await _post(client, "B1", token=other)
        answers = await asyncio.gather(*flood)
    await gateway.close()
    assert first.status_code == mine.status_code == 200 and all(r.status_code == 200 for r in answers)
    assert during == 3, [_prompt(b) for _, b in order]
    assert [_prompt(b) for _, b in order].index("B1") == 3  # a free slot was kept for it: before A's waiting four
    assert not gateway.held and not gateway.flows and not gateway.granted and not gateway.outstanding


async def _two_held(gateway):
    await gateway.ensure_started()
    dep = gateway.fleet.deployments["chat"]
    return dep, [gateway.acquire_now(dep, None), gateway.acquire_now(dep, None)]


async def test_a_slot_granted_to_a_waiting_request_is_not_taken_by_a_newcomer(fleet):  # noqa: F811
    gateway = _gateway(replica_slots=1)
    dep, held = await _two_held(gateway)
    waiting = asyncio.create_task(gateway.acquire(dep, None))
    await asyncio.sleep(0.05)
    gateway.free("chat", held[0].replica)  # granted to the waiting one, which has not run yet
    from console.gateway.slots import WAIT, Ask

    assert gateway.acquire_now(dep, None, ask=Ask(band=0, flow="other")) is WAIT
    picked = await asyncio.wait_for(waiting, 5)
    assert picked.replica == held[0].replica
    await gateway.close()


async def test_a_retried_request_granted_a_replica_it_tried_takes_it_rather_than_spinning(fleet):  # noqa: F811
    gateway = _gateway(replica_slots=1)
    dep, held = await _two_held(gateway)
    waiting = asyncio.create_task(gateway.acquire(dep, None, avoid={held[0].replica.id}))
    await asyncio.sleep(0.05)
    gateway.free("chat", held[0].replica)  # the one it tried before: no longer suspect, and the only free slot
    picked = await asyncio.wait_for(waiting, 5)
    assert picked.replica == held[0].replica
    await gateway.close()


async def test_requests_waiting_for_a_slot_when_no_replica_is_usable_go_to_wait_for_a_ready_one(fleet):  # noqa: F811
    gateway = _gateway(replica_slots=1)
    dep, held = await _two_held(gateway)
    waiting = asyncio.create_task(gateway.acquire(dep, None))
    await asyncio.sleep(0.05)
    for p in held:
        gateway.suspects[p.replica.id] = time.monotonic()
    gateway._dispatch("chat")
    assert await asyncio.wait_for(waiting, 5) is None  # proxy then waits in ready_view, announcing demand
    assert not gateway.flows and not gateway.granted
    await gateway.close()
