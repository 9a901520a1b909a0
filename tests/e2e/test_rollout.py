"""A model's directory changed through the API, against a real `manage.py up` with torch workers: its deployment's
two replicas restart onto the new files one at a time, each drained, and the deployment answers every request
meanwhile."""

import shutil

from tests.e2e.stack import wait_for


def ids_body(ids):
    return {"inputs": [{"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT64", "data": ids}]}


def test_a_changed_model_rolls_its_replicas_one_at_a_time_and_keeps_serving(stack, tiny_llama, tmp_path):
    api = stack.api()
    copy = shutil.copytree(tiny_llama, tmp_path / "tiny-llama-v2")
    assert api.post("/models", json={"name": "roll-base", "path": str(tiny_llama)}).status_code == 201
    r = api.post("/deployments", json={"name": "rolls", "model": "roll-base", "replicas": 2})
    assert r.status_code == 201, r.text
    try:
        def replicas():
            return api.get("/deployments/rolls").json().get("replicas") or []

        before = wait_for(lambda: (rs := replicas()) and len(rs) == 2 and all(x["state"] == "ready" for x in rs)
                          and {x["index"]: x["pid"] for x in rs}, timeout=180, what="two ready replicas")
        r = api.patch("/models/roll-base", json={"path": str(copy)})
        assert r.status_code == 200, r.text
        assert r.json()["path"] == str(copy.resolve())

        answers, restarting_at_once = [], 0
        with stack.gateway() as gateway:
            def rolled():
                nonlocal restarting_at_once
                answers.append(gateway.post("/v2/models/rolls/infer", json=ids_body([1, 5, 9])).status_code)
                rs = replicas()
                restarting_at_once = max(restarting_at_once, sum(1 for x in rs if x["state"] != "ready"))
                return len(rs) == 2 and all(x["state"] == "ready" and x["pid"] != before[x["index"]] for x in rs)

            wait_for(rolled, timeout=240, interval=0.2, what="both replicas restarted onto the new directory")
        assert restarting_at_once <= 1  # one at a time (a quick restart may fall between two looks)
        assert answers and set(answers) == {200}, answers  # the other replica served meanwhile
        def reasons():
            return [e["reason"] for e in api.get("/events", params={"object": "deployment/rolls"}).json()["events"]]

        # The scheduler says RolledOut at its pass after the last replica read ready: a moment after this saw it.
        wait_for(lambda: "RolledOut" in reasons(), timeout=60, what="the rollout's end on the timeline")
        assert reasons().count("Restarting") == 2, reasons()
    finally:
        api.delete("/deployments/rolls")
        api.delete("/models/roll-base")
