"""A vLLM server serves adapters up to the LoRA rank it was started for (and none when started without LoRA), so an
adapter that outgrows it rolls the deployment's replicas onto a restart, one at a time, instead of being refused by
every running replica (the probe: "max LoRA rank was sized when the replica started"). Replicas that run the
built-in engine grow their pools in place and restart for nothing."""

import pytest

from console.catalog.adapters import register_adapter
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.events.models import Event
from console.fleet.models import Gpu
from tests.adapter_files import write_adapter

pytestmark = pytest.mark.django_db
UP = "model.layers.0.mlp.up_proj"  # the conftest model's [32, 16] weight


def lora(tmp_path, name, rank):
    return str(write_adapter(tmp_path / name, {UP: (rank, 16, 32)}, r=rank))


def settled():
    """The rollout is over (as the scheduler's passes would leave it)."""
    Replica.objects.update(held={}, restarting_pid=None)


@pytest.fixture
def on_vllm(host, model):
    host.engines = {"torch": "1", "vllm": "1"}
    host.save(update_fields=["engines"])
    Gpu.objects.filter(host=host).update(simulated=False)
    dep = create_deployment("llm", "tiny", engine="auto")
    Replica.objects.create(deployment=dep, index=0, host=host, observed_state="ready", pid=7)
    return dep


def test_an_adapter_beyond_the_rank_vllm_started_for_rolls_its_replicas(on_vllm, tmp_path):
    register_adapter("first", "llm", lora(tmp_path, "first", 4))  # vLLM started without LoRA: a restart
    assert Deployment.objects.get().revision == 1
    assert Replica.objects.get().held["adapters"] == {}  # it keeps serving without the adapter until its turn
    settled()
    register_adapter("same", "llm", lora(tmp_path, "same", 8))  # rank 8 holds 4 and 8: no restart
    assert Deployment.objects.get().revision == 1 and not Replica.objects.get().held
    register_adapter("wider", "llm", lora(tmp_path, "wider", 16))
    assert Deployment.objects.get().revision == 2
    assert set(Replica.objects.get().held["adapters"]) == {"first", "same"}
    [event] = Event.objects.filter(object="adapter/wider")
    assert "restart" in event.message and "LoRA ranks up to 8" in event.message, event.message


def test_replicas_of_the_built_in_engine_restart_for_no_adapter(host, model, tmp_path):
    create_deployment("chat", "tiny")  # simulated GPUs: the built-in engine, whatever the engine setting
    Replica.objects.create(deployment=Deployment.objects.get(), index=0, host=host, observed_state="ready", pid=7)
    register_adapter("first", "chat", lora(tmp_path, "first", 4))
    register_adapter("wider", "chat", lora(tmp_path, "wider", 64))
    assert Deployment.objects.get().revision == 0 and not Replica.objects.get().held
