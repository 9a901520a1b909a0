"""The console as the fleet's one front door, against a real `manage.py up`: the official `openai` and
`tritonclient.http` clients through the console URL only; tokens and scopes; the agent's port closed to
everyone but the gateway; streamed chat and completions; models switched in on demand on a GPU too small for
two; scale to zero."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from tests.e2e.stack import start, wait_for
from tests.e2e.test_up import reference_logits
from tests.refusals import refusal


def replicas(api, name):
    body = api.get(f"/deployments/{name}").json()
    return body.get("replicas", [])


def in_state(api, name, state):
    return lambda: next((r for r in replicas(api, name) if r["state"] == state), None)


@pytest.fixture(scope="module")
def minilm(tiny_llama):
    from agent.workers.demo_models import copy_minilm

    return copy_minilm(tiny_llama.parent / "minilm")


def test_the_official_clients_work_against_the_console_url(stack, tiny_llama, minilm):
    import openai
    import tritonclient.http as triton

    api = stack.api()
    for name, path in (("gw-llama", tiny_llama), ("gw-minilm", minilm)):
        assert api.post("/models", json={"name": name, "path": str(path)}).status_code == 201
    assert api.post("/deployments", json={"name": "gw-chat", "model": "gw-llama"}).status_code == 201
    assert api.post("/deployments", json={"name": "gw-embed", "model": "gw-minilm"}).status_code == 201
    wait_for(in_state(api, "gw-chat", "ready"), timeout=120, what="gw-chat to be ready")
    wait_for(in_state(api, "gw-embed", "ready"), timeout=120, what="gw-embed to be ready")

    client = openai.OpenAI(base_url=stack.url + "v1", api_key=stack.token, max_retries=0)
    listed = {m.id: m for m in client.models.list()}
    assert {"gw-chat", "gw-embed"} <= set(listed)
    assert listed["gw-chat"].model_extra["state"] == "ready"

    done = client.completions.create(model="gw-chat", prompt="the cat", max_tokens=4, temperature=0)
    assert done.usage.completion_tokens >= 1 and done.choices[0].text is not None
    vectors = client.embeddings.create(model="gw-embed", input=["a cat sat", "a dog ran"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 384
    # Streams through the gateway, chunk by chunk, equal to the plain greedy answers.
    greedy = dict(max_tokens=12, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="gw-chat", prompt="the cat", stream=True, **greedy))
    assert streamed == client.completions.create(model="gw-chat", prompt="the cat", **greedy).choices[0].text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model="gw-chat", messages=messages, **greedy)
    chunks = list(client.chat.completions.create(model="gw-chat", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **greedy))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    # Triton's client: the URL takes no scheme; the token goes in a header.
    url = stack.url.removeprefix("http://").rstrip("/")
    auth = {"Authorization": f"Bearer {stack.token}"}
    triton_client = triton.InferenceServerClient(url=url, network_timeout=120)
    assert triton_client.is_server_live()
    assert triton_client.is_model_ready("gw-chat", headers=auth)
    ids = np.array([[1, 5, 42, 7, 300, 2]], dtype=np.int64)
    tensor = triton.InferInput("input_ids", list(ids.shape), "INT64")
    tensor.set_data_from_numpy(ids, binary_data=False)
    result = triton_client.infer("gw-chat", [tensor], headers=auth,
                                 outputs=[triton.InferRequestedOutput("logits", binary_data=False)])
    assert np.array_equal(result.as_numpy("logits"), reference_logits(tiny_llama, ids.tolist()))

    # Without a token: 401. An inference-only token infers but gets 403 from the REST API.
    anonymous = openai.OpenAI(base_url=stack.url + "v1", api_key="mg_api_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    with pytest.raises(Exception, match="401"):
        triton_client.infer("gw-chat", [tensor])
    inference_only = stack.manage("createapitoken", "robot", "--scope", "inference")
    with stack.gateway(inference_only) as gateway:
        assert gateway.post("/v2/models/gw-chat/infer", json={"inputs": [
            {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]}).status_code == 200
    rest = httpx.get(stack.url + "api/v1/deployments", headers={"Authorization": f"Bearer {inference_only}"})
    assert rest.status_code == 403 and "inference" in refusal(rest)

    # The agent's own port is closed to everyone but the gateway.
    endpoint = replicas(api, "gw-chat")[0]["endpoint"]
    direct = httpx.post(f"{endpoint}/v2/models/gw-chat/infer", json={"inputs": []}, timeout=10)
    assert direct.status_code == 401
    assert httpx.get(f"{endpoint}/metrics", timeout=10).status_code == 401
    # ... and Prometheus reaches it through the console, which holds the secret the agent got in its desired state.
    with stack.gateway() as gateway:
        [target] = gateway.get("/metrics/agents").json()
        scraped = gateway.get(target["labels"]["__metrics_path__"])
    assert scraped.status_code == 200, scraped.text
    assert 'deployment="gw-chat",status="200"}' in scraped.text
    assert api.delete("/deployments/gw-chat").status_code == 204
    assert api.delete("/deployments/gw-embed").status_code == 204


def test_a_gpu_too_small_for_two_switches_models_on_demand_by_tier(tiny_llama, tmp_path):
    # One simulated GPU with room for one tiny Llama replica (about 2 MiB), not two.
    stack, drop_db = start(tmp_path / "data", gpus="sim:1x3MiB", MODELGRID_MIN_RESIDENCY_SECONDS="1")
    try:
        api = stack.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        for name in ("left", "right"):
            r = api.post("/deployments", json={"name": name, "model": "tiny", "min_replicas": 0, "max_replicas": 1})
            assert r.status_code == 201, r.text
        first = wait_for(lambda: next((n for n in ("left", "right") if in_state(api, n, "ready")()), None),
                         timeout=120, what="one of the two to be ready")
        other = "right" if first == "left" else "left"
        body = {"model": other, "prompt": "the cat", "max_tokens": 2, "temperature": 0}
        with stack.gateway() as gateway:
            r = gateway.post("/v1/completions", json=body)  # queued while the scheduler switches it in
            assert r.status_code == 200, r.text
            assert float(r.headers["x-modelgrid-queue-ms"]) > 0
            assert in_state(api, first, "sleeping")()  # the idle one made room, asleep in host memory
            assert [line for line in stack.lines if f"slept replica/{first}#0" in line]

            # A critical deployment at its minimum takes the GPU; a standard request cannot displace it.
            r = api.post("/deployments", json={"name": "vital", "model": "tiny", "priority": "critical"})
            assert r.status_code == 201
            wait_for(in_state(api, "vital", "ready"), timeout=120, what="vital to be ready")
            began = time.monotonic()
            refused = gateway.post("/v1/completions", json=body | {"model": first})
            assert refused.status_code == 503, refused.text
            assert time.monotonic() - began < 20  # the scheduler's answer, not the 60 s wait running out
            assert "higher tier" in refused.json()["error"]["message"]
            assert int(refused.headers["retry-after"]) > 0
        assert in_state(api, "vital", "ready")()
        assert not [line for line in stack.lines if "vital#0" in line and ("slept replica/vital" in line or
                                                                           "preempted replica/vital" in line)]
    finally:
        stack.stop()
        drop_db()


def test_a_scale_to_zero_deployment_leaves_its_gpu_when_idle_and_comes_back_on_the_next_request(
        tiny_llama, tmp_path):
    stack, drop_db = start(tmp_path / "data", args=("--sleep-budget", "0"))  # no room to sleep: idle means stopped
    try:
        api = stack.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        r = api.post("/deployments", json={"name": "rare", "model": "tiny", "min_replicas": 0, "max_replicas": 1,
                                           "idle_timeout_s": 2})
        assert r.status_code == 201, r.text
        body = {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}]}
        with stack.gateway() as gateway:
            assert gateway.post("/v2/models/rare/infer", json=body).status_code == 200
            wait_for(lambda: api.get("/deployments/rare").json()["serving"] == "cold", timeout=60,
                     what="rare to be stopped after its idle window")
            assert not [r for r in replicas(api, "rare") if r["pid"]]  # its worker is gone
            # The gateway reads the fleet every second while idle: it says so within its next refresh.
            wait_for(lambda: {m["id"]: m["state"] for m in gateway.get("/v1/models").json()["data"]}["rare"] == "cold",
                     timeout=5, what="the gateway to see rare cold")
            again = gateway.post("/v2/models/rare/infer", json=body)
            assert again.status_code == 200, again.text
            assert float(again.headers["x-modelgrid-queue-ms"]) > 0  # it was loaded for this request
    finally:
        stack.stop()
        drop_db()
