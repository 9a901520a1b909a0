"""A running replica's adapter pool grows with the adapters registered on it, against a real `manage.py up` with
torch workers: an adapter of a larger rank than the replica's first is served through the console's gateway, not
refused as "not loaded in this replica" (the pool's budget was sized for the first adapter when it was made)."""

import numpy as np

from tests.adapter_files import write_adapter
from tests.e2e.stack import remove, wait_for

GIB = 1 << 30


def lora(tmp_path, name, rank, seed):
    modules = {f"model.layers.{i}.self_attn.q_proj": (rank, 64, 64) for i in range(2)}
    modules |= {f"model.layers.{i}.mlp.up_proj": (rank, 64, 128) for i in range(2)}
    return write_adapter(tmp_path / name, modules, seed=seed, r=rank, target_modules=["q_proj", "up_proj"])


def ids_body(ids, adapter=None):
    body = {"inputs": [{"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT64", "data": ids}]}
    return body | ({"parameters": {"adapter": adapter}} if adapter else {})


def only_replica(api, name):
    replicas = api.get(f"/deployments/{name}").json().get("replicas") or [{}]
    return replicas[0]


def test_an_adapter_of_a_larger_rank_added_to_a_running_replica_is_served(stack, tiny_llama, tmp_path):
    api = stack.api()
    assert api.post("/models", json={"name": "grow-base", "path": str(tiny_llama)}).status_code in (201, 409)
    assert api.post("/deployments", json={"name": "grows", "model": "grow-base"}).status_code == 201
    try:
        small = api.post("/adapters", json={"name": "grows-small", "deployment": "grows",
                                             "path": str(lora(tmp_path, "small", 2, seed=1))})
        assert small.status_code == 201, small.text
        ready = wait_for(lambda: (r := only_replica(api, "grows")).get("state") == "ready" and r, timeout=120,
                         what="the replica to be ready")
        with stack.gateway() as gateway:
            wait_for(lambda: gateway.post("/v2/models/grows-small/infer", json=ids_body([1, 5, 9])).status_code
                     == 200, timeout=60, what="the first adapter to be served")
            reserved = ready["reserved_bytes"]

            big = api.post("/adapters", json={"name": "grows-big", "deployment": "grows",
                                               "path": str(lora(tmp_path, "big", 32, seed=2))})
            assert big.status_code == 201, big.text
            assert big.json()["nbytes"] > small.json()["nbytes"] * 8
            served = wait_for(lambda: (r := gateway.post("/v2/models/grows-big/infer", json=ids_body([1, 5, 9])))
                              .status_code == 200 and r, timeout=90, what="the larger adapter to be served")
            base = gateway.post("/v2/models/grows/infer", json=ids_body([1, 5, 9]))
            assert base.status_code == 200, base.text
            tuned = np.array(served.json()["outputs"][0]["data"])
            assert not np.allclose(tuned, np.array(base.json()["outputs"][0]["data"]))
            done = gateway.post("/v1/completions", json={"model": "grows-big", "prompt": "the cat", "max_tokens": 3,
                                                          "temperature": 0})
            assert done.status_code == 200, done.text

        # The same worker grew its pool in place, and the reservation followed, saying why.
        after = wait_for(lambda: (r := only_replica(api, "grows")).get("reserved_bytes", 0) > reserved and r,
                         timeout=30, what="the reservation to grow")
        assert after["pid"] == ready["pid"] and after["state"] == "ready"
        assert not after.get("adapter_error"), after
        events = api.get("/events", params={"object": "deployment/grows", "reason": "Resized"}).json()["events"]
        grown = [e for e in events if e["reason"] == "Resized"]
        assert grown and "adapter" in grown[0]["message"], [(e["reason"], e["message"]) for e in events]
    finally:
        remove(api, deployments=("grows",), models=("grow-base",))
