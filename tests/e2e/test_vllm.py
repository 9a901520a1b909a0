"""vLLM as a deployment's engine, for real (its CPU build, `make vllm`), through a real `manage.py up` and the
official `openai` client at the console URL only: completions and chat with the model's template, streams,
echo with logprobs, JSON-schema outputs, tools, /v1/responses, two LoRA adapters loaded at runtime and one
unloaded, an abandoned stream cancelled in vLLM, a vLLM killed under its replica (failed with its last lines,
then started again), a model vLLM's CPU build cannot run refused when it is deployed.
Two vLLM deployments sharing one GPU in time are in test_vllm_time_sharing.py, on a stack of their own.

vLLM takes about a minute to start on two cores, so one stack serves most of these. They run in the first
pass only, as every end-to-end test not marked db_stack does."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from openai import OpenAI

from tests.e2e.stack import start, wait_for
from tests.e2e.vllm import FLAGS, GATEWAY_ENV, START_S, VLLM_PYTHON, client, needs_vllm, serving

pytestmark = needs_vllm


@pytest.fixture(scope="module")
def vllm_stack(llama64, tmp_path_factory):
    stack, drop_db = start(tmp_path_factory.mktemp("vllm-data"), gpus="sim:1x24GiB",
                           MODELGRID_VLLM_PYTHON=VLLM_PYTHON, **GATEWAY_ENV)
    try:
        api = stack.api()
        assert api.post("/models", json={"name": "llama64", "path": str(llama64)}).status_code == 201
        r = api.post("/deployments", json={"name": "vchat", "model": "llama64", "engine": "vllm",
                                           "engine_args": FLAGS})
        assert r.status_code == 201, r.text
        for i in (1, 2):  # registered before it starts: vLLM starts with LoRA on
            r = api.post("/adapters", json={"name": f"a{i}", "deployment": "vchat",
                                            "path": str(llama64.parent / f"lora{i}")})
            assert r.status_code == 201, r.text
        wait_for(lambda: serving(api, "vchat") and len(serving(api, "vchat")["adapter_stats"]) == 2, START_S,
                 interval=1, what="vchat ready with both adapters")
        yield stack
    finally:
        stack.stop()
        drop_db()


def test_the_openai_client_gets_vllms_features_through_the_console(vllm_stack):
    openai = client(vllm_stack)
    raw = openai.completions.with_raw_response.create(model="vchat", prompt="hello world", max_tokens=4, echo=True,
                                                      logprobs=2)
    assert raw.headers["x-modelgrid-replica"] == "vchat#0"
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.text.startswith("hello world") and completion.usage.completion_tokens == 4
    assert choice.logprobs.token_logprobs[0] is None and len(choice.logprobs.tokens) == completion.usage.total_tokens

    chat = openai.chat.completions.create(model="vchat", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert chat.usage.prompt_tokens > 5  # the model's chat template wrapped the one word
    chunks = list(openai.chat.completions.create(model="vchat", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=5, stream=True))
    assert len(chunks) > 2 and chunks[0].model == "vchat" and chunks[-1].choices[0].finish_reason == "length"

    # Structured output holds even with random weights: the engine's grammar decides what may follow.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    out = openai.chat.completions.create(model="vchat", messages=[{"role": "user", "content": "json"}],
                                         max_tokens=50, temperature=0,
                                         response_format={"type": "json_schema",
                                                          "json_schema": {"name": "ok", "schema": schema}})
    assert out.choices[0].finish_reason == "stop", out.choices[0].message.content
    parsed = json.loads(out.choices[0].message.content)
    assert set(parsed) == {"ok"} and isinstance(parsed["ok"], bool)

    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    called = openai.chat.completions.create(model="vchat", messages=[{"role": "user", "content": "weather?"}],
                                            max_tokens=8, tools=tools)  # the deployment's flags took the parser
    assert called.choices[0].finish_reason in ("length", "stop", "tool_calls")

    response = openai.responses.create(model="vchat", input="hello", max_output_tokens=4)
    assert response.usage.output_tokens == 4 and response.output_text
    tokens = httpx.post(vllm_stack.url + "tokenize", headers={"Authorization": f"Bearer {vllm_stack.token}"},
                        json={"model": "vchat", "prompt": "hello world"})
    assert tokens.status_code == 200 and tokens.json()["count"] == 4

    # vLLM's own refusals come back as they are; v2 tensors are the built-in engine's.
    with pytest.raises(Exception, match="max_tokens"):
        openai.completions.create(model="vchat", prompt="x", max_tokens=-3)
    v2 = httpx.post(vllm_stack.url + "v2/models/vchat/infer", json={"inputs": []},
                    headers={"Authorization": f"Bearer {vllm_stack.token}"})
    assert v2.status_code == 400 and "vllm engine" in v2.json()["error"]


def test_two_adapters_load_at_runtime_and_one_is_unloaded(vllm_stack):
    openai = client(vllm_stack)
    texts = {m: openai.completions.create(model=m, prompt="hello world", max_tokens=6, temperature=0).choices[0].text
             for m in ("vchat", "a1", "a2")}
    assert len(set(texts.values())) == 3  # each adapter changes what the base model says
    api = vllm_stack.api()
    assert api.delete("/adapters/a2").status_code == 204
    wait_for(lambda: [a["name"] for a in serving(api, "vchat")["adapter_stats"]] == ["a1"], 60, interval=0.5,
             what="a2 to be unloaded from vLLM")
    with pytest.raises(Exception, match="a2"):
        openai.completions.create(model="a2", prompt="hello", max_tokens=2)
    assert openai.completions.create(model="a1", prompt="hello world", max_tokens=6,
                                     temperature=0).choices[0].text == texts["a1"]


def generated_tokens(stack) -> float:
    """vLLM's own count of generated tokens, relayed by the agent; a scrape that vLLM did not answer in time (the
    relay leaves its lines out) is asked again, so a missed scrape never reads as zero."""
    def read() -> list[float] | None:  # in a list: 0 tokens is an answer
        text = httpx.get(stack.url + "metrics/agents/local", headers={"Authorization": f"Bearer {stack.token}"},
                         timeout=30).text
        lines = [line for line in text.splitlines() if line.startswith("vllm:generation_tokens_total{")]
        return [sum(float(line.rsplit(" ", 1)[1]) for line in lines)] if lines else None

    return wait_for(read, 60, interval=0.5, what="vLLM's metrics through the agent")[0]


def test_an_abandoned_stream_is_cancelled_in_vllm(vllm_stack):
    # One stream of 16 choices (a request takes 16 at most): 3,840 tokens asked for, left as soon as its first piece
    # arrives. A cold vLLM may send that piece only once it has generated them all (seen on CPU for its first
    # requests of a shape): such a try proves nothing and is made again, a bounded number of times.
    body = {"model": "vchat", "prompt": "hi", "max_tokens": 240, "ignore_eos": True, "n": 16, "stream": True}
    asked = 16 * 240
    tries = []
    with httpx.Client(timeout=60) as http:
        for _ in range(5):
            before = generated_tokens(vllm_stack)
            with http.stream("POST", vllm_stack.url + "v1/completions", json=body,
                             headers={"Authorization": f"Bearer {vllm_stack.token}"}) as r:
                assert r.status_code == 200
                next(r.iter_lines())
            at_close = generated_tokens(vllm_stack) - before
            if at_close < asked / 4:
                break
            tries.append(at_close)
        else:
            pytest.fail(f"vLLM had generated most of each stream before its first piece arrived: {tries}")
    time.sleep(5)  # what vLLM would have done by now, had it gone on
    done = generated_tokens(vllm_stack) - before
    assert 0 < done < asked / 2, (at_close, done, tries)  # it stopped well short of the 3,840 tokens asked for


def test_a_killed_vllm_fails_its_replica_with_its_last_lines_and_comes_back(vllm_stack):
    api = vllm_stack.api()
    worker = serving(api, "vchat")["pid"]
    import psutil

    (server,) = [p for p in psutil.Process(worker).children() if "vllm.entrypoints" in " ".join(p.cmdline())]
    engine = server.children(recursive=True)  # its engine core and worker, which outlive a server killed outright
    assert engine
    os.kill(server.pid, signal.SIGKILL)
    failed = wait_for(lambda: (r := api.get("/deployments/vchat").json()["replicas"][0])["state"] == "failed" and r,
                      60, interval=0.2, what="the replica to be reported failed")
    assert "vLLM was killed by signal SIGKILL; its last lines:" in failed["observed_reason"]
    assert psutil.wait_procs(engine, timeout=30)[1] == []  # none left holding its memory
    wait_for(lambda: serving(api, "vchat", fail_fast=False), START_S, interval=1, what="vchat to be started again")
    assert client(vllm_stack).completions.create(model="vchat", prompt="hi", max_tokens=2).usage.completion_tokens


def test_a_vllm_killed_mid_stream_ends_its_clients_stream_with_an_error_and_comes_back(vllm_stack):
    import openai
    import psutil

    api = vllm_stack.api()
    worker = serving(api, "vchat")["pid"]
    (server,) = [p for p in psutil.Process(worker).children() if "vllm.entrypoints" in " ".join(p.cmdline())]
    # A client that would wait a minute between two pieces: the stream must end well before that, by itself.
    impatient = OpenAI(base_url=vllm_stack.url.rstrip("/") + "/v1", api_key=vllm_stack.token, timeout=60,
                       max_retries=0)
    stream = impatient.completions.create(model="vchat", prompt="hi", max_tokens=240, n=16, stream=True,
                                          extra_body={"ignore_eos": True})
    # Its headers came: the answer has begun. Killed now, vLLM is cut off a few steps into the 240 it was asked for
    # (once the client had read a first piece, an unloaded vLLM had sometimes finished them all).
    os.kill(server.pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(openai.APIError) as raised:
        for _ in stream:
            pass
    ended = time.monotonic() - killed
    assert not isinstance(raised.value, openai.APIConnectionError), raised.value  # an error event, not a cut or hang
    assert "its vLLM server broke off the stream" in raised.value.message, raised.value.message
    assert ended < 30, ended  # promised within 5 s; bounded generously on a loaded machine
    print(f"the stream ended {ended:.2f} s after vLLM was killed")
    # Its worker exits with vLLM and a new one starts: until the agent has seen that, the old one still reads ready.
    wait_for(lambda: (r := serving(api, "vchat", fail_fast=False)) and r["pid"] != worker, START_S, interval=1,
             what="vchat to be started again")
    assert client(vllm_stack).completions.create(model="vchat", prompt="hi", max_tokens=2).usage.completion_tokens


def test_a_model_vllms_cpu_build_cannot_run_is_refused_when_deployed_with_the_reason(vllm_stack, tmp_path):
    """The demo tiny-llama (heads 16 wide) on vLLM's CPU build read ready, then died at every first request and
    restarted every 55 s. Every host of this stack runs vLLM on CPU: the deployment is refused, saying why, and
    nothing is stored; on the built-in engine it is taken."""
    from agent.workers.demo_models import build_tiny_llama

    api = vllm_stack.api()
    path = build_tiny_llama(tmp_path / "tiny-llama")
    assert api.post("/models", json={"name": "tiny-llama", "path": str(path)}).status_code == 201
    r = api.post("/deployments", json={"name": "tiny-vllm", "model": "tiny-llama", "engine": "vllm"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"] == (
        "model 'tiny-llama' cannot run on engine vllm here: vLLM's CPU attention needs head_dim >= 32; this model's "
        "heads are 16 wide (every host that runs vllm runs it on CPU); deploy it with engine torch or auto")
    assert api.get("/deployments/tiny-vllm").status_code == 404
    r = api.post("/deployments", json={"name": "tiny-torch", "model": "tiny-llama", "engine": "torch", "replicas": 0})
    assert r.status_code == 201, r.text  # no replica: the vLLM stack's GPU stays its own
    r = api.patch("/deployments/tiny-torch", json={"engine": "vllm"})
    assert r.status_code == 422 and "needs head_dim >= 32" in r.text
    assert api.delete("/deployments/tiny-torch").status_code == 204
    assert api.delete("/models/tiny-llama").status_code == 204
