"""An agent speaks only for its own host: over a real link, its reports cannot steer another host's replicas,
GPUs or a deployment it does not run (issue 11: one agent token scaled `emb` 1 -> 3 with a fake p95)."""

import json

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from console.catalog.services import register_model
from console.control.observed import refresh_observations
from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.fleet.models import AgentCredential, Gpu, Host
from tests.console.realtime.agent_link import GPU, GiB, linked

pytestmark = pytest.mark.django_db(transaction=True)
FAKE_SLOW = {"deployment": "emb", "requests": 5000, "request_rate": 80.0, "error_rate": 0.0, "p95_ms": 1e7}


def fleet_with_emb_on_home(model_dir) -> int:
    """Host `home` runs the one replica of `emb` (SLO 100 ms, up to 3 replicas); h1 has not connected yet."""
    home = Host.objects.create(name="home", endpoint="http://127.0.0.1:9", connected=True, last_seen=timezone.now())
    Gpu.objects.create(host=home, index=0, uuid="SIM-home-0", name="sim", total_bytes=24 * GiB, simulated=True)
    register_model("tiny", str(model_dir))
    create_deployment("emb", "tiny", min_replicas=1, max_replicas=3, slo_latency_ms=100)
    reconcile_once()
    replica = Replica.objects.get(deployment__name="emb")
    assert replica.host == home
    Replica.objects.filter(pk=replica.pk).update(observed_state="ready", pid=41)
    return replica.pk


async def round_trip(comm) -> None:
    """Messages are applied in order: once a bad one is answered, everything sent before it was applied."""
    await comm.send_to(text_data=json.dumps({"type": "ack"}))
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "error"


async def test_an_agent_cannot_steer_a_deployment_it_runs_no_replica_of(model_dir):
    home_replica = await database_sync_to_async(fleet_with_emb_on_home)(model_dir)
    token = await database_sync_to_async(lambda: AgentCredential.issue("h1")[1])()
    comm = await linked(token)
    # h1 claims emb is dreadfully slow, that home's replica failed, and that its GPU 0 is full.
    await comm.send_to(text_data=json.dumps({
        "type": "report", "gpus": [GPU | {"used_bytes": 20 * GiB}], "serving": [FAKE_SLOW],
        "replicas": [{"type": "replica_status", "replica_id": home_replica, "state": "failed", "reason": "fake",
                      "pid": 666}],
    }))
    await comm.send_to(text_data=json.dumps({"type": "replica_status", "replica_id": home_replica,
                                             "state": "stopped", "pid": 667}))
    await round_trip(comm)

    await database_sync_to_async(reconcile_once)()  # the scheduler's SLO logic reads the figures
    dep = await database_sync_to_async(Deployment.objects.get)(name="emb")
    assert (dep.observed_p95_ms, dep.violating, dep.replicas) == (None, False, 1)
    assert await database_sync_to_async(Replica.objects.filter(deployment=dep).count)() == 1
    replica = await database_sync_to_async(Replica.objects.get)(pk=home_replica)
    assert (replica.observed_state, replica.pid, replica.reason) != ("failed", 666, "fake")
    assert replica.observed_state == "ready" and replica.pid == 41
    home_gpu = await database_sync_to_async(Gpu.objects.get)(host__name="home")
    own_gpu = await database_sync_to_async(Gpu.objects.get)(host__name="h1")
    assert (home_gpu.used_bytes, own_gpu.used_bytes) == (0, 20 * GiB)  # the report did land, on h1's own rows

    # The same figures count once h1 does run a replica of emb: the report path itself works.
    await database_sync_to_async(lambda: Replica.objects.create(
        deployment=Deployment.objects.get(name="emb"), index=1, host=Host.objects.get(name="h1")))()
    await comm.send_to(text_data=json.dumps({"type": "report", "gpus": [GPU], "serving": [FAKE_SLOW]}))
    await round_trip(comm)
    await database_sync_to_async(refresh_observations)(timezone.now())
    dep = await database_sync_to_async(Deployment.objects.get)(name="emb")
    assert dep.observed_p95_ms == 1e7 and dep.violating
    await comm.disconnect()
