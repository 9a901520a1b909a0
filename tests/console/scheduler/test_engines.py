"""Engines are labels: a host's GPUs carry engine.NAME=yes for each engine its agent runs, and a deployment's engine
selects them (console/scheduler/engines.py), in the planner and in the dry run's plan file alike."""

from console.scheduler import Deployment, Gpu, PlanInput, plan
from console.scheduler.dryrun import run_dry_plan
from console.scheduler.engines import engine_labels, engine_selector

GiB = 1024**3


def test_a_vllm_deployment_goes_only_where_a_host_runs_vllm_and_says_so_when_none_does():
    torch_only = Gpu("a/0", "a", 24 * GiB, labels=engine_labels(["torch"]))
    both = Gpu("b/0", "b", 24 * GiB, labels=engine_labels(["torch", "vllm"]))
    deployments = (Deployment("llm", 4 * GiB, selector=engine_selector("vllm")),
                   Deployment("any", 4 * GiB, replicas=2, selector=engine_selector("auto")))
    result = plan(PlanInput((torch_only, both), deployments))
    placed = {(r.deployment, r.index): r.gpus for r in result.replicas}
    assert placed[("llm", 0)] == ("b/0",) and {placed[("any", 0)], placed[("any", 1)]} <= {("a/0",), ("b/0",)}
    refused = plan(PlanInput((torch_only,), deployments[:1]))
    assert "1 GPU excluded by label engine.vllm=yes" in refused.unplaced[0].reason


def test_an_agent_that_names_no_engine_runs_torch():
    assert engine_labels([]) == engine_labels(None) == {"engine.torch": "yes"}
    assert engine_selector("torch") == {"engine.torch": "yes"} and engine_selector("auto") == {}


def test_the_plan_file_takes_each_gpus_engines_and_each_deployments_engine():
    doc = {"gpus": [{"id": "a/0", "total_bytes": 24 * GiB}, {"id": "b/0", "total_bytes": 24 * GiB,
                                                             "engines": ["torch", "vllm"]}],
           "deployments": [{"name": "llm", "bytes": 4 * GiB, "engine": "vllm"}]}
    result = run_dry_plan(doc)
    assert [r["gpus"] for r in result["replicas"]] == [["b/0"]]
