"""An agent's message that the console cannot apply gets an `error` reply, and the link stays open: values out of
the database's range fail validation, and anything that still goes wrong while applying one is logged."""

import json
import logging

import pytest
from channels.db import database_sync_to_async
from django.db import DatabaseError

from console.deployments.models import Deployment, Replica
from console.fleet.models import AgentCredential, Gpu, Host
from console.intake import stages as intake
from tests.console.realtime.agent_link import GPU, HELLO, linked

pytestmark = pytest.mark.django_db(transaction=True)
SERVING = {"deployment": "chat", "requests": 3, "request_rate": 0.05, "error_rate": 0.0, "p95_ms": 12.5}


def report(**fields) -> dict:
    return {"type": "report", "gpus": [GPU]} | fields


def status(replica_id, **fields) -> dict:
    return {"type": "replica_status", "replica_id": replica_id, "state": "ready"} | fields


@pytest.fixture
def token():
    return AgentCredential.issue("h1")[1]


async def still_open(comm) -> None:
    """A hello round trip: the link still reads, applies and answers."""
    await comm.send_to(text_data=json.dumps(HELLO))
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "desired_state"


def chat_replica(host_name: str = "h1") -> int:
    from console.catalog.models import Model

    model = Model.objects.create(name="tiny", path="/nonexistent", architecture="LlamaForCausalLM",
                                 model_type="llama", task="generate", stored_dtype="float32", parameters=1,
                                 weights_bytes=1, estimate_bytes=1)
    dep = Deployment.objects.create(name="chat", model=model)
    return Replica.objects.create(deployment=dep, index=0, host=Host.objects.get(name=host_name)).pk


OUT_OF_RANGE = {
    "used bytes of 2**63": (report(gpus=[GPU | {"used_bytes": 2**63}]), "used_bytes"),
    "a gpu index past 32 bits": (report(gpus=[GPU | {"index": 2**31}]), "index"),
    "an infinite p95": (report(serving=[SERVING | {"p95_ms": float("inf")}]), "p95_ms"),
    "a NaN request rate": (report(serving=[SERVING | {"request_rate": float("nan")}]), "request_rate"),
    "a negative pid": (status(None, pid=-1), "pid"),
    "a pid past 32 bits": (status(None, pid=2**31), "pid"),
    "a replica id of 2**63": (status(2**63), "replica_id"),
    "an ack of generation 2**63": ({"type": "ack", "generation": 2**63}, "generation"),
}


@pytest.mark.parametrize(("message", "field"), OUT_OF_RANGE.values(), ids=OUT_OF_RANGE.keys())
async def test_a_value_out_of_range_gets_an_error_and_the_link_stays_open(token, message, field):
    comm = await linked(token)
    replica_id = await database_sync_to_async(chat_replica)()
    if message.get("replica_id", 0) is None:  # a status for the replica just made
        message = message | {"replica_id": replica_id}
    await comm.send_to(text_data=json.dumps(message))
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and field in reply["reason"] and "invalid message" in reply["reason"]
    await still_open(comm)
    gpu = await database_sync_to_async(Gpu.objects.get)(host__name="h1")
    assert gpu.used_bytes == 0 and gpu.index == 0  # nothing of it was stored
    replica = await database_sync_to_async(Replica.objects.get)()
    assert replica.pid is None and replica.observed_state == "pending"
    assert await database_sync_to_async(lambda: Host.objects.get(name="h1").serving)() == {}
    await comm.disconnect()


async def test_a_failure_while_applying_a_message_is_logged_and_answered(token, monkeypatch, caplog):
    def broken(reports):
        raise DatabaseError("disk I/O error")

    monkeypatch.setattr(intake, "_apply_reports", broken)
    comm = await linked(token)
    with caplog.at_level(logging.ERROR, logger="modelgrid.realtime"):
        await comm.send_to(text_data=json.dumps(report()))
        reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and "report" in reply["reason"] and "DatabaseError" in reply["reason"]
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged and logged[0].exc_info is not None  # with its traceback
    await still_open(comm)
    await comm.disconnect()


async def test_an_ack_beyond_the_hosts_generation_is_refused(token):
    comm = await linked(token)
    await database_sync_to_async(Host.objects.filter(name="h1").update)(generation=3)
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 9}))
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and "generation 9" in reply["reason"] and "3" in reply["reason"]
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 3}))
    await still_open(comm)
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    assert host.acked_generation == 3
    await comm.disconnect()


async def test_the_largest_values_in_bounds_are_stored(token):
    from agent.protocol.messages import BIG, MAX_GPU_BYTES, SMALL

    comm = await linked(token)
    replica_id = await database_sync_to_async(chat_replica)()
    big_gpu = GPU | {"index": SMALL, "total_bytes": MAX_GPU_BYTES, "used_bytes": MAX_GPU_BYTES,
                     "own_bytes": MAX_GPU_BYTES, "utilization": 100.0}
    await comm.send_to(text_data=json.dumps(report(
        gpus=[big_gpu], ram_free_bytes=BIG, serving=[SERVING | {"requests": BIG, "p95_ms": 1.7e308}],
        replicas=[status(replica_id, state="sleeping", pid=SMALL, measured_bytes=BIG, loaded_bytes=BIG,
                         total_bytes=BIG, host_bytes=BIG, reason="r" * 10_000,
                         sleep_wake={"direction": "sleep", "bytes": BIG, "seconds": 1e300, "bandwidth": 1e-300},
                         adapters=[{"name": "a", "tier": "disk", "nbytes": BIG, "requests": BIG}])],
    )))
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 0}))
    await comm.send_to(text_data=json.dumps({"type": "ack"}))  # answered: everything before it was applied
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and "generation" in reply["reason"]
    gpu = await database_sync_to_async(Gpu.objects.get)(host__name="h1", index=SMALL)
    assert (gpu.total_bytes, gpu.own_bytes) == (MAX_GPU_BYTES, MAX_GPU_BYTES)
    replica = await database_sync_to_async(Replica.objects.get)(pk=replica_id)
    assert (replica.pid, replica.host_bytes, replica.observed_state) == (SMALL, BIG, "sleeping")
    assert replica.adapter_stats[0]["nbytes"] == BIG and len(replica.observed_reason) == 4000
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    assert host.ram_free_bytes == BIG and host.serving["chat"]["requests"] == BIG
    await comm.disconnect()


async def test_a_link_reads_its_next_message_before_the_last_is_applied_and_keeps_their_order(token, monkeypatch,
                                                                                              settings):
    # An ack sent right after a report joins the report's batch instead of waiting for the report to be
    # applied first (a link used to hand over one message at a time), and is applied after it.
    settings.MODELGRID_INTAKE_TICK_SECONDS = 0.3
    from console.intake import batcher

    batcher._batchers.clear()  # a batcher with this tick
    batches = []
    apply = intake.apply_hosts

    def recorded(items, leases=None):
        batches.append([item.message.type for item in items])
        return apply(items, leases)

    monkeypatch.setattr(intake, "apply_hosts", recorded)
    comm = await linked(token)
    await database_sync_to_async(Host.objects.filter(name="h1").update)(generation=2)
    await comm.send_to(text_data=json.dumps(report(gpus=[GPU | {"used_bytes": 5}])))
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 2}))
    await comm.send_to(text_data=json.dumps({"type": "ack"}))  # refused at once, answered after the two
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and "generation" in reply["reason"]
    assert batches == [["report", "ack"]]
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    assert host.acked_generation == 2
    assert await database_sync_to_async(lambda: Gpu.objects.get(host__name="h1").used_bytes)() == 5
    await comm.disconnect()
