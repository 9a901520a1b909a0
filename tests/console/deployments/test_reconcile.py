import pytest

from console.deployments.models import Replica
from console.deployments.reconcile import desired_state, reconcile_once
from console.deployments.services import create_deployment, delete_deployment
from console.fleet.models import Gpu, Host

pytestmark = pytest.mark.django_db
GiB = 1024**3


def test_it_places_a_new_replica_and_bumps_the_host_generation(host, model):
    create_deployment("chat", "tiny")
    result = reconcile_once()
    assert result.changed_hosts == (host.pk,)
    replica = Replica.objects.get()
    assert replica.host == host
    assert [g.index for g in replica.gpus.all()] == [1]  # best fit: the smaller GPU
    # Simulated GPUs: the worker runs on the CPU, so the CPU estimate is reserved (nothing calibrated yet).
    estimate = replica.deployment.estimates["cpu"]
    assert replica.reserved_bytes == estimate["total_bytes"]
    assert replica.reservation == {"device": "cpu", "estimated_bytes": estimate["total_bytes"], "factor": 1.0,
                                   "calibrated_from": 0}
    host.refresh_from_db()
    state = desired_state(host)
    assert state.generation == 1
    assert [(r.deployment, r.model_path, r.gpus) for r in state.replicas] == [("chat", model.path, [1])]


def test_a_pass_with_nothing_new_changes_nothing(host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    assert reconcile_once().changed_hosts == ()
    host.refresh_from_db()
    assert host.generation == 1


def test_deleting_a_deployment_changes_the_desired_state(host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    delete_deployment("chat")
    assert reconcile_once().changed_hosts == (host.pk,)
    host.refresh_from_db()
    assert desired_state(host).replicas == [] and host.generation == 2


def test_replicas_never_land_on_offline_hosts(host, model):
    Host.objects.filter(pk=host.pk).update(connected=False)
    create_deployment("chat", "tiny")
    reconcile_once()
    assert Replica.objects.get().host is None


def test_a_model_too_big_for_every_gpu_is_unschedulable(host, model):
    dep = create_deployment("huge", "tiny")
    dep.estimates["cpu"]["total_bytes"] = 30 * GiB
    dep.save()
    reconcile_once()
    dep.refresh_from_db()
    assert dep.state == "unschedulable"
    assert dep.reason == "needs 30.00 GiB; the largest free space is 24.00 GiB on h1/0"


def test_foreign_memory_on_a_gpu_is_not_placed_over(host, model):
    # Something outside ModelGrid uses all of GPU 1 but a few bytes.
    Gpu.objects.filter(host=host, index=1).update(used_bytes=8 * GiB - 10)
    create_deployment("chat", "tiny")
    reconcile_once()
    assert [g.index for g in Replica.objects.get().gpus.all()] == [0]


def test_scaling_down_removes_the_highest_replicas(host, model):
    dep = create_deployment("chat", "tiny", replicas=3)
    reconcile_once()
    dep.replicas = 1
    dep.save()
    reconcile_once()
    assert list(Replica.objects.values_list("index", flat=True)) == [0]
