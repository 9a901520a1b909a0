"""A deployment on an engine that cannot run its model is refused when it is saved, with the engine's reason: vLLM's
CPU build refuses heads narrower than 32 (the demo tiny-llama's are 16: it read ready, then died at every first
request), so a vllm deployment of it is refused while every host that runs vLLM runs it on CPU. `auto` is never
refused: it runs such a model on the built-in engine."""

import json

import pytest

from console.catalog.services import register_model
from console.deployments.models import Deployment
from console.fleet.models import Gpu, Host
from tests.conftest import write_model_dir
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
CPU_HEADS = "vLLM's CPU attention needs head_dim >= 32; this model's heads are 16 wide"


@pytest.fixture
def narrow(db, tmp_path):
    """The demo tiny-llama's shape: 64 wide, 4 heads of 16."""
    return register_model("narrow", str(write_model_dir(tmp_path / "narrow", hidden=64)))


@pytest.fixture
def vllm_host(host):
    Host.objects.filter(pk=host.pk).update(engines={"torch": "2", "vllm": "0.32"})
    return host


def test_a_model_vllm_cannot_run_on_any_host_that_runs_it_is_refused_and_nothing_is_stored(api, narrow, vllm_host):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "narrow", "engine": "vllm"})
    assert r.status_code == 422, r.content
    assert refusal(r) == (f"model 'narrow' cannot run on engine vllm here: {CPU_HEADS} (every host that runs vllm "
                          "runs it on CPU); deploy it with engine torch or auto")
    assert not Deployment.objects.filter(name="chat").exists()
    # auto runs it on the built-in engine; a change to vllm later is refused as its creation was.
    assert api.post("/api/v1/deployments", {"name": "chat", "model": "narrow"}).status_code == 201
    r = api.patch("/api/v1/deployments/chat", {"engine": "vllm"})
    assert r.status_code == 422 and CPU_HEADS in refusal(r)
    assert Deployment.objects.get(name="chat").engine == "auto"


def test_a_host_that_runs_vllm_on_real_gpus_can_run_it(api, narrow, vllm_host):
    Gpu.objects.filter(host=vllm_host, index=0).update(simulated=False)
    assert api.post("/api/v1/deployments", {"name": "chat", "model": "narrow", "engine": "vllm"}).status_code == 201


def test_without_a_host_that_runs_the_engine_only_what_no_device_takes_is_refused(api, narrow, tmp_path):
    # No host runs vLLM yet: one that runs it on GPUs may come, and placement waits for it.
    assert api.post("/api/v1/deployments", {"name": "chat", "model": "narrow", "engine": "vllm"}).status_code == 201
    register_model("bert", str(write_model_dir(tmp_path / "bert", hidden=128, arch="BertModel", model_type="bert")))
    r = api.post("/api/v1/deployments", {"name": "embed", "model": "bert", "engine": "vllm"})
    assert r.status_code == 422
    assert "vLLM serves causal language models here; this model is an encoder" in refusal(r)


def test_a_bulk_create_refuses_the_item_vllm_cannot_run_by_its_index(api, narrow, model, vllm_host):
    items = [{"name": "a", "model": "tiny", "engine": "torch"}, {"name": "b", "model": "narrow", "engine": "vllm"}]
    r = api.post("/api/v1/deployments/bulk", {"deployments": items})
    assert r.status_code == 422 and CPU_HEADS in refusal(r)
    assert r.json()["detail"][0]["loc"][:3] == ["body", "deployments", 1]
    assert not Deployment.objects.exists()


def test_new_files_a_vllm_deployment_could_not_run_are_refused_naming_it(api, vllm_host, tmp_path):
    register_model("llm", str(write_model_dir(tmp_path / "wide", hidden=128)))
    assert api.post("/api/v1/deployments", {"name": "chat", "model": "llm", "engine": "vllm"}).status_code == 201
    narrow = write_model_dir(tmp_path / "narrow", hidden=128)  # the same shape, in heads 16 wide
    config = json.loads((narrow / "config.json").read_text())
    (narrow / "config.json").write_text(json.dumps(config | {"num_attention_heads": 8}))
    r = api.patch("/api/v1/models/llm", {"path": str(narrow)})
    assert r.status_code == 422 and "deployment 'chat'" in refusal(r) and CPU_HEADS in refusal(r)
