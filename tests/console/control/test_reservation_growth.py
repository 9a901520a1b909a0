"""A running replica's reservation follows its deployment's estimate as adapters are added: kept where it is, its
row, its desired state and the worker's limits grow in place, and the timeline says why. The probe: the plan reserved
the larger estimate for a kept replica, but its row (what the agent is told, and the pages show) kept the bytes it
was placed with, so the replica's pool was never granted room for an adapter larger than its first."""

import pytest

from console.catalog.adapters import register_adapter
from console.control.desired import desired_state
from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.events.models import Event
from tests.adapter_files import write_adapter

pytestmark = pytest.mark.django_db
UP = "model.layers.0.mlp.up_proj"  # the conftest model's [32, 16] weight


def test_a_kept_replicas_reservation_grows_with_its_adapter_pool_and_says_why(host, model, tmp_path):
    create_deployment("chat", "tiny")
    register_adapter("small", "chat", str(write_adapter(tmp_path / "small", {UP: (2, 16, 32)}, r=2)))
    reconcile_once()
    before = Replica.objects.get()
    gpus = [g.index for g in before.gpus.all()]

    big = register_adapter("big", "chat", str(write_adapter(tmp_path / "big", {UP: (64, 16, 32)}, r=64)))
    result = reconcile_once()
    after = Replica.objects.get()
    estimate = Deployment.objects.get().estimates["cpu"]
    assert after.reserved_bytes == estimate["total_bytes"] > before.reserved_bytes
    assert after.reserved_bytes - before.reserved_bytes == big.nbytes
    assert after.reservation["estimated_bytes"] == estimate["total_bytes"]
    assert [g.index for g in after.gpus.all()] == gpus and after.action == "keep"  # in place, not moved
    assert result.changed_hosts == (host.pk,)
    host.refresh_from_db()
    [pushed] = desired_state(host).replicas
    assert pushed.reserved_bytes == after.reserved_bytes and pushed.adapter_pool_bytes == estimate["adapter_pool_bytes"]
    [event] = Event.objects.filter(reason="Resized")
    assert event.object == "replica/chat#0" and "adapter pool" in event.message, event.message
    assert "in place" in event.message

    # Nothing more to grow: the next pass writes nothing and tells nothing.
    assert reconcile_once().changed_hosts == ()
    assert Event.objects.filter(reason="Resized").count() == 1
