"""Temporal and adapter sharing under the console's desired state, against a real `manage.py up`:
a critical deployment preempts a batch one, which sleeps in host memory and wakes in place when the
room comes back; an adapter registered through the API is served through the console's gateway (OpenAI-style
and v2), chosen by name."""

import numpy as np

from tests.adapter_files import write_adapter
from tests.e2e.stack import start, wait_for


def replica(api, name):
    body = api.get(f"/deployments/{name}").json()
    return body["replicas"][0] if body.get("replicas") else {}


def in_state(api, name, state):
    return lambda: (r := replica(api, name)) and r["state"] == state and r


def test_a_preempted_replica_sleeps_in_host_memory_and_wakes_in_place(tiny_llama, tmp_path):
    # One simulated GPU with room for one tiny Llama replica (about 2 MiB), not two.
    stack, drop_db = start(tmp_path / "data", gpus="sim:1x3MiB")
    try:
        api = stack.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        assert api.post("/deployments", json={"name": "bulk", "model": "tiny", "priority": "batch"}).status_code == 201
        before = wait_for(in_state(api, "bulk", "ready"), timeout=120, what="bulk to be ready")

        r = api.post("/deployments", json={"name": "vital", "model": "tiny", "priority": "critical"})
        assert r.status_code == 201, r.text
        wait_for(in_state(api, "vital", "ready"), timeout=120, what="vital to be ready")
        asleep = wait_for(in_state(api, "bulk", "sleeping"), timeout=60, what="bulk to sleep")
        assert asleep["pid"] == before["pid"]  # the same worker, its weights in host memory
        assert asleep["gpus"] == [] and ("asleep in" in asleep["reason"] or "sleeping in" in asleep["reason"])
        preempted = [line for line in stack.lines if "preempted replica/bulk#0" in line]
        assert preempted and "vital#0" in preempted[0]  # the pass that put it to sleep said who and why
        assert api.get("/deployments/bulk").json()["state"] == "asleep"  # where the console wants it, and says so

        assert api.delete("/deployments/vital").status_code == 204
        awake = wait_for(in_state(api, "bulk", "ready"), timeout=60, what="bulk to wake")
        assert awake["pid"] == before["pid"]  # woken in place, not reloaded
        assert awake["gpus"] == [0]
        # The pass that woke it said so (its row's action is "keep" again by the next pass).
        assert [line for line in stack.lines if "woken replica/bulk#0" in line and "from local RAM" in line]
    finally:
        stack.stop()
        drop_db()


def ids_body(ids, adapter=None):
    body = {"inputs": [{"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT64", "data": ids}]}
    return body | ({"parameters": {"adapter": adapter}} if adapter else {})


def test_an_adapter_registered_through_the_api_is_served_by_name(stack, tiny_llama, tmp_path):
    api = stack.api()
    assert api.post("/models", json={"name": "tiny-base", "path": str(tiny_llama)}).status_code == 201
    assert api.post("/deployments", json={"name": "base", "model": "tiny-base"}).status_code == 201
    modules = {f"model.layers.{i}.self_attn.q_proj": (8, 64, 64) for i in range(2)}
    modules |= {f"model.layers.{i}.mlp.up_proj": (8, 64, 128) for i in range(2)}
    path = write_adapter(tmp_path / "pirate", modules, target_modules=["q_proj", "up_proj"])
    r = api.post("/adapters", json={"name": "pirate", "deployment": "base", "path": str(path)})
    assert r.status_code == 201, r.text
    wait_for(in_state(api, "base", "ready"), timeout=120, what="base to be ready")

    with stack.gateway() as agent:  # through the console's front door, like any client
        wait_for(lambda: "pirate" in {m["id"] for m in agent.get("/v1/models").json()["data"]}, timeout=60,
                 what="the gateway to list the adapter")
        base = agent.post("/v2/models/base/infer", json=ids_body([1, 5, 9]))
        tuned = agent.post("/v2/models/base/infer", json=ids_body([1, 5, 9], adapter="pirate"))
        by_name = agent.post("/v2/models/pirate/infer", json=ids_body([1, 5, 9]))
        assert base.status_code == tuned.status_code == by_name.status_code == 200, tuned.text
        logits = [np.array(r.json()["outputs"][0]["data"]) for r in (base, tuned, by_name)]
        assert not np.allclose(logits[0], logits[1])  # the adapter changes the output
        np.testing.assert_allclose(logits[1], logits[2], rtol=1e-6)  # however it is named

        done = agent.post("/v1/completions", json={"model": "pirate", "prompt": "the cat", "max_tokens": 4,
                                                   "temperature": 0})
        assert done.status_code == 200, done.text
        assert done.json()["model"] == "pirate" and done.json()["usage"]["completion_tokens"] >= 1
        unknown = agent.post("/v1/completions", json={"model": "parrot", "prompt": "x", "max_tokens": 1})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    # The console hears how the adapter was used, tier and requests included.
    stats = wait_for(lambda: [a for a in replica(api, "base").get("adapter_stats", []) if a["requests"]], timeout=30,
                     what="adapter stats in the console")
    assert stats[0]["name"] == "pirate" and stats[0]["tier"] == "gpu"
    assert api.delete("/deployments/base").status_code == 204
