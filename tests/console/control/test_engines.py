"""A deployment's engine through the console: hosts report theirs in the hello, a vllm deployment is placed only
where a host runs vLLM (the refusal names the label), and each desired replica names the engine that runs it."""

import pytest

from agent.protocol import EngineInfo, Hello
from console.control import reconcile
from console.control.desired import desired_rows_by_host
from console.control.reconcile import reconcile_once
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.fleet.models import AgentCredential, Gpu, Host
from console.intake.stages import register_hello

pytestmark = pytest.mark.django_db
GiB = 1024**3


def hello(name, engines):
    gpu = {"index": 0, "uuid": f"SIM-{name}", "name": "sim", "total_bytes": 24 * GiB, "used_bytes": 0,
           "own_bytes": 0, "simulated": True}
    return Hello(protocol=1, host=name, agent_version="t", endpoint="", gpus=[gpu],
                 engines=[EngineInfo(name=e, version="1") for e in engines])


def test_a_hosts_engines_come_from_its_hello_and_an_older_agent_runs_torch():
    first, _ = register_hello(AgentCredential.issue("a")[0], hello("a", ["torch", "vllm"]))
    older, _ = register_hello(AgentCredential.issue("b")[0], hello("b", []))
    assert Host.objects.get(pk=first.pk).engines == {"torch": "1", "vllm": "1"}
    assert Host.objects.get(pk=older.pk).engines == {"torch": ""}


def test_a_vllm_deployment_waits_for_a_host_that_runs_it_and_its_replicas_say_which_engine(model):
    reconcile.start_leading()  # hosts heard from from now on are fresh
    register_hello(AgentCredential.issue("a")[0], hello("a", ["torch"]))
    create_deployment("llm", "tiny", engine="vllm")
    create_deployment("auto", "tiny")
    reconcile_once()
    llm = Replica.objects.get(deployment__name="llm")
    assert llm.host_id is None and "excluded by label engine.vllm=yes" in llm.reason
    register_hello(AgentCredential.issue("b")[0], hello("b", ["torch", "vllm"]))
    Gpu.objects.filter(host__name="a").update(total_bytes=1)  # leave "auto" only b's GPU, where vLLM runs too
    Replica.objects.filter(deployment__name="auto").delete()
    reconcile_once()
    b = Host.objects.get(name="b")
    rows = {r["deployment"]: r for r in desired_rows_by_host([b.pk])[b.pk]}
    # On simulated GPUs "auto" keeps the built-in engine (the faster on CPUs); on real ones a causal LM gets vLLM.
    assert rows["llm"]["engine"] == "vllm" and "engine" not in rows["auto"]
    Gpu.objects.filter(host=b).update(simulated=False)
    rows = {r["deployment"]: r for r in desired_rows_by_host([b.pk])[b.pk]}
    assert rows["auto"]["engine"] == "vllm"


def test_auto_runs_a_model_vllm_cannot_run_on_the_built_in_engine_even_where_a_host_runs_vllm_on_gpus(tmp_path):
    import json

    from console.catalog.services import register_model
    from tests.conftest import write_model_dir

    path = write_model_dir(tmp_path / "m", hidden=128)
    (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 99}}}))
    register_model("wide-tokenizer", str(path))  # ids up to 99 for a vocab_size of 32: vLLM refuses it everywhere
    host, _ = register_hello(AgentCredential.issue("b")[0], hello("b", ["torch", "vllm"]))
    Gpu.objects.filter(host=host).update(simulated=False)
    auto = create_deployment("auto", "wide-tokenizer")
    Replica.objects.create(deployment=auto, index=0, host=host, desired_state="ready")
    (row,) = desired_rows_by_host([host.pk])[host.pk]
    assert "engine" not in row  # the built-in engine's, left out as its default
