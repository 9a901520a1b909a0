"""Each host's desired state, built from plain rows: every field the agent's DesiredReplica names, in its JSON form,
with the deployment's adapters and the favourites its replicas asked for."""

import pytest

from agent.protocol import DesiredReplica
from console.control.desired import desired_rows_by_host
from console.deployments.models import Replica
from console.fleet.models import Host
from tests.console.fleet_scene import MiB, scene

pytestmark = pytest.mark.django_db


def test_desired_rows_are_desired_replicas_as_pushed(model):
    scene(model.path)
    hosts = dict(Host.objects.values_list("name", "pk"))
    rows = desired_rows_by_host(hosts.values())
    assert set(rows) == set(hosts.values())
    every = [r for host_rows in rows.values() for r in host_rows]
    # Every field named, but the engine's where it is the default (torch) and the revision at 0: an agent from before
    # engines (or revisions) refuses them.
    assert every and all(r == DesiredReplica.model_validate(r).model_dump(
        mode="json", exclude=(set() if "engine" in r else {"engine", "engine_args"})
        | (set() if "revision" in r else {"revision"})) for r in every)
    assert all("engine" not in r for r in every)  # no host here runs vLLM
    assert all([r["id"] for r in host_rows] == sorted(r["id"] for r in host_rows) for host_rows in rows.values())
    chat = [r for r in rows[hosts["gpu-a"]] if r["deployment"] == "chat"]
    assert [r["gpus"] for r in chat] == [[0], [1]]
    # Each replica's index, so the agent's metrics name it as the pages do ("chat#2").
    assert {r["id"]: r["index"] for r in every} == dict(Replica.objects.filter(pk__in=[r["id"] for r in every])
                                                        .values_list("pk", "index"))
    first = chat[0]
    assert (first["model_path"], first["dtype"], first["mps_percentage"]) == (model.path, model.stored_dtype, 72)
    assert first["adapters"] == [{"name": "sql", "path": "/adapters/sql-lora", "pinned": True},
                                 {"name": "support", "path": "/adapters/support-lora-v2", "pinned": False}]
    assert (first["adapter_pool_bytes"], first["adapter_host_bytes"]) == (36 * MiB, 144 * MiB)
    assert first["adapter_hints"] == {"sql": 1.0, "support": 1.0}  # both asked for, both fit the device tier
    embed = next(r for r in rows[hosts["gpu-a"]] if r["deployment"] == "embed")
    assert (embed["adapters"], embed["adapter_pool_bytes"], embed["adapter_hints"]) == ([], 0, {})


def test_replicas_whose_deployment_was_deleted_after_they_were_read_are_left_out(model):
    # A delete that commits between the read of the replicas and the read of their deployments (PostgreSQL reads
    # each statement afresh): those replicas are gone too, and the host was marked stale by the delete.
    from console.catalog.models import Adapter
    from console.deployments.models import Deployment, Replica

    scene(model.path)
    hosts = dict(Host.objects.values_list("name", "pk"))
    chat = Deployment.objects.get(name="chat")
    Deployment.objects.filter(pk=chat.pk)._raw_delete("default")  # its replicas stay until commit (deferred keys)
    try:
        rows = desired_rows_by_host(hosts.values())
    finally:  # what the delete would have taken along, before the test's end checks the keys
        orphans = list(Replica.objects.filter(deployment_id=chat.pk).order_by().values_list("pk", flat=True))
        Replica.gpus.through.objects.filter(replica_id__in=orphans)._raw_delete("default")
        Replica.objects.filter(pk__in=orphans)._raw_delete("default")
        Adapter.objects.filter(deployment_id=chat.pk)._raw_delete("default")
    assert all(r["deployment"] != "chat" for host_rows in rows.values() for r in host_rows)
    assert any(r["deployment"] == "embed" for r in rows[hosts["gpu-a"]])
