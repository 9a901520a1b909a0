"""The gateway's fleet snapshot (console/gateway/fleet.load_fleet) from plain values carried between snapshots: it
must say what the rows say, read as model instances, after every kind of change."""

import pytest

from console.catalog.memory import model_positions
from console.deployments.models import Deployment, Replica
from console.deployments.serving import serving_state
from console.fleet.models import AgentCredential, Host
from console.gateway.fleet import DeploymentView, ReplicaView, load_fleet
from console.scheduler.types import TIER_RANK
from tests.console.fleet_scene import scene

pytestmark = pytest.mark.django_db


def expected() -> tuple[dict[str, DeploymentView], dict[str, str]]:
    """The snapshot as read from model instances, field by field."""
    secrets = {c.host_name: c.gateway_secret for c in AgentCredential.objects.all()}
    deployments, adapters = {}, {}
    for dep in Deployment.objects.select_related("model"):
        replicas = list(Replica.objects.filter(deployment=dep).select_related("host").order_by("index"))
        ready = tuple(ReplicaView(r.pk, f"{dep.name}#{r.index}", r.host.endpoint.rstrip("/"),
                                  secrets.get(r.host.name, ""), r.host.name)
                      for r in replicas if r.host is not None and r.desired_state == r.observed_state == "ready"
                      and r.host.connected and r.host.endpoint and not dep.standby)
        names = tuple(sorted(a.name for a in dep.adapters.all()))
        adapters |= dict.fromkeys(names, dep.name)
        deployments[dep.name] = DeploymentView(
            dep.name, dep.priority, TIER_RANK[dep.priority], dep.model.task, serving_state(replicas, dep.standby),
            ready, names, dep.demand_status, dep.demand_reason, int(dep.created.timestamp()), dep.slo_latency_ms,
            team=dep.team_id, context=dep.seq if dep.engine == "vllm" and dep.seq else model_positions(dep.model))
    return deployments, adapters


def test_the_snapshot_says_what_the_rows_say_through_changes(model_dir):
    rows = scene(str(model_dir))
    AgentCredential.issue("gpu-a")
    fleet = load_fleet()
    assert (fleet.deployments, fleet.adapters) == expected()
    assert [r.label for r in fleet.deployments["chat"].ready] == ["chat#0", "chat#1"]
    assert fleet.deployments["chat"].ready[0].secret and not fleet.deployments["chat"].ready[1].secret  # b has none
    assert fleet.adapters == {"sql": "chat", "support": "chat"}

    Host.objects.filter(name="gpu-b").update(connected=False)  # chat#1 is on it
    Deployment.objects.filter(name="embed").update(standby=True, demand_status="waiting")
    Replica.objects.filter(deployment=rows["chat"], index=2).update(observed_state="ready")
    Replica.objects.filter(deployment=rows["big"]).delete()
    AgentCredential.issue("gpu-b")
    fleet = load_fleet()
    assert (fleet.deployments, fleet.adapters) == expected()
    assert [r.label for r in fleet.deployments["chat"].ready] == ["chat#0", "chat#2"]
    assert fleet.deployments["embed"].serving == "standby" and fleet.deployments["embed"].ready == ()
    assert fleet.deployments["big"].serving == "cold"

    Host.objects.filter(name="gpu-a").update(endpoint="")  # no address: nothing there takes requests
    Deployment.objects.filter(name="nightly-batch").delete()
    fleet = load_fleet()
    assert (fleet.deployments, fleet.adapters) == expected()
    assert fleet.deployments["chat"].ready == () and "nightly-batch" not in fleet.deployments


def test_the_snapshot_names_each_replicas_host_and_each_hosts_lifecycle(model_dir):
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    scene(str(model_dir))
    fleet = load_fleet()
    assert [(r.label, r.host) for r in fleet.deployments["chat"].ready] == [("chat#0", "gpu-a"), ("chat#1", "gpu-b")]
    assert {name: h.state for name, h in fleet.hosts.items()} == {"gpu-a": "connected", "gpu-b": "connected"}

    assert not any(h.lost for h in fleet.hosts.values())

    now = timezone.now()
    Host.objects.filter(name="gpu-a").update(connected=False, unknown_since=now, last_seen=now)  # its link closed
    Host.objects.filter(name="gpu-b").update(connected=False, unknown_since=now - timedelta(minutes=2),
                                             evicted_at=now, last_seen=now - timedelta(minutes=2))
    fleet = load_fleet()
    assert {name: h.state for name, h in fleet.hosts.items()} == {"gpu-a": "unknown", "gpu-b": "offline"}
    assert fleet.deployments["chat"].ready == ()
    # Lost: not connected and unheard for a lease (a lapsed lease; a closed link its agent did not come back to).
    assert {name: h.lost for name, h in fleet.hosts.items()} == {"gpu-a": False, "gpu-b": True}
    Host.objects.filter(name="gpu-a").update(last_seen=now - timedelta(seconds=settings.MODELGRID_HOST_LEASE_SECONDS))
    assert load_fleet().hosts["gpu-a"].lost


def test_a_deployments_context_is_its_vllm_seq_else_what_its_models_config_declares(tmp_path):
    import json

    from console.catalog.services import register_model
    from console.deployments.services import create_deployment
    from tests.conftest import write_model_dir

    path = write_model_dir(tmp_path / "long")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 512}))
    register_model("long", str(path))
    register_model("bare", str(write_model_dir(tmp_path / "bare")))
    create_deployment("auto", "long", seq=128)  # the built-in engine takes the model's whole positions
    create_deployment("pinned", "long", seq=128, engine="vllm")  # vLLM's --max-model-len
    create_deployment("default", "bare")
    contexts = {name: dep.context for name, dep in load_fleet().deployments.items()}
    assert contexts == {"auto": 512, "pinned": 128, "default": 2048}  # Llama's when its config says none
