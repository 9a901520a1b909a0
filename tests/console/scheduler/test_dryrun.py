"""The dry-run planner's document: parse errors name the field, defaults fill in, the output keeps its keys."""

import json

import pytest

from console.scheduler.dryrun import PlanInputError, parse_input, plan_document, run_dry_plan
from console.scheduler.render import plan_to_text

EXAMPLE = {
    "strategy": "memory-optimized", "buffer_bytes": 0,
    "gpus": [{"id": "h1/0", "host": "h1", "total_bytes": 85899345920, "used_bytes": 0, "labels": {}}],
    "deployments": [{"name": "m1", "bytes": 1300000000, "replicas": 1, "gpus_per_replica": 1,
                     "priority": "standard"}],
}


def doc(**changes):
    d = json.loads(json.dumps(EXAMPLE))
    d.update(changes)
    return d


def test_it_plans_the_example_of_the_issue_with_its_exact_output_keys():
    out = run_dry_plan(EXAMPLE)
    assert {"replicas", "unplaced", "gpus_used", "memory_utilization", "elapsed_ms"} <= set(out)
    [replica] = out["replicas"]
    assert (replica["deployment"], replica["index"], replica["gpus"]) == ("m1", 0, ["h1/0"])
    assert replica["reason"].startswith("best fit: needs 1.21 GiB")
    assert out["unplaced"] == [] and out["gpus_used"] == 1
    json.dumps(out)  # JSON-ready


def test_it_lists_what_does_not_fit_under_unplaced_with_a_reason():
    out = run_dry_plan(doc(deployments=[{"name": "m1", "bytes": 50 * 2**30, "replicas": 2}]))
    assert [r["index"] for r in out["replicas"]] == [0]
    assert out["unplaced"] == [{"deployment": "m1", "index": 1,
                                "reason": "needs 50.00 GiB; the largest free space is 30.00 GiB on h1/0"}]


def test_it_defaults_every_optional_field_and_ignores_unknown_ones():
    request = parse_input({"gpus": [{"id": "h1/0", "total_bytes": 1000, "colour": "red"}],
                           "deployments": [{"name": "m", "bytes": 10, "owner": "me"}], "comment": "hi"})
    assert request.strategy == "memory-optimized" and request.buffer_bytes == 0
    assert request.gpus[0].host == "h1" and request.gpus[0].used_bytes == 0
    assert request.gpus[0].labels == {"engine.torch": "yes"}  # the built-in engine, as every agent runs
    d = request.deployments[0]
    assert (d.replicas, d.low, d.high, d.gpus_per_replica, d.priority) == (1, 1, 1, 1, "standard")


def test_the_strategy_argument_overrides_the_document():
    assert parse_input(EXAMPLE, "balance").strategy == "balance"
    assert run_dry_plan(EXAMPLE, "fill-first")["strategy"] == "fill-first"


def test_min_or_max_alone_brackets_the_replica_count():
    request = parse_input(doc(deployments=[{"name": "a", "bytes": 1, "replicas": 2, "max_replicas": 5},
                                           {"name": "b", "bytes": 1, "replicas": 2, "min_replicas": 4}]))
    a, b = request.deployments
    assert (a.low, a.high) == (2, 5) and (b.low, b.high) == (4, 4)


@pytest.mark.parametrize("change, message", [
    ({"gpus": [{"id": "a/0", "total_bytes": 1}, {"id": "a/1", "total_bytes": 1}, {"id": "a/2", "total_bytes": -1}]},
     "gpus[2].total_bytes must be a positive integer, got -1"),
    ({"gpus": [{"total_bytes": 1}]}, "gpus[0].id is required"),
    ({"gpus": [{"id": "a/0", "total_bytes": 1}, {"id": "a/0", "total_bytes": 1}]}, "gpus[1].id 'a/0' is a duplicate"),
    ({"gpus": [{"id": "a/0", "total_bytes": True}]}, "gpus[0].total_bytes must be a positive integer, got a boolean"),
    ({"gpus": [{"id": "a/0", "total_bytes": 1, "labels": {"gpu": 3}}]}, "gpus[0].labels.gpu must be a string, got 3"),
    ({"gpus": "h1/0"}, "gpus must be a list, got a string"),
    ({"deployments": [{"name": "m", "bytes": "1GB"}]}, "deployments[0].bytes must be a positive integer, got a string"),
    ({"deployments": [{"name": "m", "bytes": 1, "priority": "urgent"}]},
     "deployments[0].priority must be one of critical, high, standard, batch, got 'urgent'"),
    ({"deployments": [{"name": "m", "bytes": 1, "min_replicas": 3, "max_replicas": 2}]},
     "deployments[0].min_replicas (3) exceeds max_replicas (2)"),
    ({"deployments": [{"name": "m", "bytes": 1, "gpus_per_replica": 0}]},
     "deployments[0].gpus_per_replica must be a positive integer, got 0"),
    ({"deployments": [{"name": "m", "bytes": 1, "profile": "gpu"}]},
     "deployments[0].profile must be one of compute, memory, io or null, got 'gpu'"),
    ({"deployments": [{"name": "m", "bytes": 1, "spread": "host"}]},
     "deployments[0].spread must be one of preferred, required, none, got 'host'"),
    ({"deployments": [{"name": "m", "bytes": 1, "tolerations": {"pool": 1}}]},
     "deployments[0].tolerations.pool must be a string, got 1"),
    ({"gpus": [{"id": "a/0", "total_bytes": 1, "taints": ["pool"]}]}, "gpus[0].taints must be an object, got a list"),
    ({"deployments": [{"name": "m", "bytes": 1}, {"name": "m", "bytes": 2}]},
     "deployments[1].name 'm' is a duplicate"),
    ({"strategy": "densest"}, "strategy must be one of fill-first, balance, memory-optimized, latency-sensitive, "
                              "got 'densest'"),
    ({"buffer_bytes": -5}, "buffer_bytes must be a non-negative integer, got -5"),
    ({"replicas": [{"deployment": "m1", "index": 0, "gpus": ["h1/0"], "state": "warm"}]},
     "replicas[0].state must be 'ready' or 'sleeping', got 'warm'"),
])
def test_it_names_the_field_that_is_wrong(change, message):
    with pytest.raises(PlanInputError) as caught:
        parse_input(doc(**change))
    assert str(caught.value) == message


def test_it_refuses_a_document_that_is_not_an_object():
    with pytest.raises(PlanInputError, match="the plan input must be a JSON object, got a list"):
        parse_input([])


def test_a_bad_strategy_argument_names_the_option():
    with pytest.raises(PlanInputError, match="--strategy must be one of"):
        parse_input(EXAMPLE, "densest")


def test_it_renders_a_plain_text_table_with_reasons():
    text = plan_to_text(plan_document(doc(deployments=[{"name": "m1", "bytes": 50 * 2**30, "replicas": 2}])))
    assert text.startswith("strategy memory-optimized: 1 replicas ready on 1 GPUs")
    assert "DEPLOYMENT  #  ACTION  STATE  GPUS  MPS  REASON" in text
    assert "unplaced:" in text and "the largest free space is 30.00 GiB on h1/0" in text
