"""A deployment's engine settings through the API: its vLLM flags (an allowlist, a refusal naming the flag, nothing
stored), what a vllm replica reserves (vLLM's own memory, calibrated apart), and the flags in its desired state."""

import pytest

from agent.engines.vllm import RUNTIME_BYTES as VLLM_RUNTIME_BYTES
from console.control.desired import desired_rows_by_host
from console.deployments.models import Deployment, Replica
from console.fleet.models import Host
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
TOOLS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def test_engine_flags_are_set_shown_and_a_refused_one_is_named_and_changes_nothing(api, model):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "engine": "vllm", "engine_args": TOOLS})
    assert r.status_code == 201, r.content
    assert r.json()["engine_args"] == TOOLS
    r = api.patch("/api/v1/deployments/chat", {"engine_args": ["--trust-remote-code"]})
    assert r.status_code == 422 and "'--trust-remote-code' is not one a deployment may set" in refusal(r)
    r = api.patch("/api/v1/deployments/chat", {"engine_args": ["--tool-call-parser"]})
    assert r.status_code == 422 and "'--tool-call-parser' needs a value" in refusal(r)
    assert Deployment.objects.get(name="chat").engine_args == TOOLS
    assert api.patch("/api/v1/deployments/chat", {"engine_args": []}).json()["engine_args"] == []


@pytest.mark.parametrize("args, named", [
    (["--structured-outputs-config", '{"reasoning_parser_plugin": "/tmp/evil.py"}'],
     "'--structured-outputs-config': key 'reasoning_parser_plugin' is not one a deployment may set"),
    (["--tool-parser-plugin", "/tmp/evil.py"], "'--tool-parser-plugin' is not one a deployment may set"),
    (["--max-num-seqs", "1e9"], "'--max-num-seqs' takes an integer from 1 to 1,024, not '1e9'"),
    (["--tensor-parallel-size", "64"], "'--tensor-parallel-size' takes an integer from 1 to 16, not '64'"),
    (["--generation-config", "/etc"], "'--generation-config': path is outside the model roots"),
])
def test_a_plugin_a_value_out_of_range_or_a_path_outside_the_roots_is_a_422_naming_it(api, model, args, named):
    assert api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "engine": "vllm",
                                            "engine_args": TOOLS}).status_code == 201
    r = api.patch("/api/v1/deployments/chat", {"engine_args": args})
    assert r.status_code == 422 and named in refusal(r), r.content
    assert Deployment.objects.get(name="chat").engine_args == TOOLS
    r = api.post("/api/v1/deployments", {"name": "other", "model": "tiny", "engine": "vllm", "engine_args": args})
    assert r.status_code == 422 and named in refusal(r) and not Deployment.objects.filter(name="other").exists()


def test_a_generation_config_inside_the_model_roots_is_taken(api, model, model_dir):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "engine": "vllm",
                                         "engine_args": ["--generation-config", str(model_dir)]})
    assert r.status_code == 201, r.content
    r = api.patch("/api/v1/deployments/chat", {"engine_args": ["--generation-config", str(model_dir / "none")]})
    assert r.status_code == 422 and "no such directory in the model roots" in refusal(r)


def test_tensor_and_pipeline_parallelism_must_span_the_replicas_gpus(api, model):
    tp = ["--tensor-parallel-size", "2"]
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "engine": "vllm", "engine_args": tp})
    assert r.status_code == 422 and "replicas have 1 (gpus_per_replica)" in refusal(r)
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "engine": "vllm", "engine_args": tp,
                                         "gpus_per_replica": 2})
    assert r.status_code == 201, r.content
    # Changing the GPUs alone is checked against the flags it keeps.
    r = api.patch("/api/v1/deployments/chat", {"gpus_per_replica": 1})
    assert r.status_code == 422 and "'--tensor-parallel-size' x '--pipeline-parallel-size' make 2" in refusal(r)
    assert Deployment.objects.get(name="chat").gpus_per_replica == 2


def test_a_vllm_deployment_reserves_vllms_own_memory_and_calibrates_apart(api, model):
    api.post("/api/v1/deployments", {"name": "builtin", "model": "tiny", "engine": "torch"})
    api.post("/api/v1/deployments", {"name": "llm", "model": "tiny", "engine": "vllm"})
    builtin, llm = (Deployment.objects.get(name=n).estimates for n in ("builtin", "llm"))
    for device in ("cpu", "cuda"):
        runtime = VLLM_RUNTIME_BYTES[device]
        assert llm[device]["overhead_bytes"] == builtin[device]["overhead_bytes"] + runtime
        assert llm[device]["family"] == builtin[device]["family"] + "+vllm"
    assert llm["cpu"]["kv_cache_bytes"] == 1 << 30  # the CPU build's KV cache comes in whole GiB
    # Changing the engine changes the estimate with it.
    api.patch("/api/v1/deployments/llm", {"engine": "torch"})
    assert Deployment.objects.get(name="llm").estimates == builtin


def test_a_vllm_replicas_desired_state_carries_its_flags(api, model, host):
    api.post("/api/v1/deployments", {"name": "llm", "model": "tiny", "engine": "vllm", "engine_args": TOOLS})
    Host.objects.filter(pk=host.pk).update(engines={"torch": "2", "vllm": "0.32"})
    Replica.objects.create(deployment=Deployment.objects.get(name="llm"), index=0, host=host, desired_state="ready")
    (row,) = desired_rows_by_host([host.pk])[host.pk]
    assert (row["engine"], row["engine_args"]) == ("vllm", TOOLS)
