"""A deployment's engine settings through the API: its vLLM flags (an allowlist, a refusal naming the flag, nothing
stored), what a vllm replica reserves (vLLM's own memory, calibrated apart), and the flags in its desired state."""

import pytest

from agent.artifacts.estimate import VLLM_RUNTIME_BYTES
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
