"""llama.cpp as a deployment's engine, for real (its server from xllamacpp's wheel), through a real `manage.py up`
and the official `openai` client at the console URL only: a quantized GGUF file the test writes itself is
registered as a model, refused by the engines that read safetensors, deployed on engine llamacpp (and by auto),
answers completions, chats and streams with the engine's own usage, and its tokens reach the usage API."""

from __future__ import annotations

import time

import pytest

from agent.engines.llamacpp import LlamacppEngine
from tests.e2e.stack import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not LlamacppEngine.program.default, reason="no xllamacpp here (make install gives it)"),
]


@pytest.fixture(scope="module")
def gguf(tiny_llama):
    """The tiny Llama, quantized to Q4_0, in the stack's model store."""
    from agent.engines.llamacpp.convert import write_gguf

    return write_gguf(tiny_llama, tiny_llama.parent / "tiny-llama-q4.gguf", "Q4_0")


def ready(api, name):
    return lambda: any(r["state"] == "ready" for r in api.get(f"/deployments/{name}").json().get("replicas", []))


def test_a_quantized_gguf_file_registers_deploys_and_serves_through_the_console(stack, gguf):
    import openai

    api = stack.api()
    made = api.post("/models", json={"name": "gguf-q4", "path": str(gguf)})
    assert made.status_code == 201, made.text
    model = api.get("/models/gguf-q4").json()
    assert (model["architecture"], model["task"], model["stored_dtype"]) == ("llama", "causal-lm", "Q4_0")
    assert model["weights_bytes"] < gguf.stat().st_size

    # The engines that read safetensors directories refuse it, naming the one that runs it.
    refused = api.post("/deployments", json={"name": "gguf-torch", "model": "gguf-q4", "engine": "torch"})
    assert refused.status_code == 422, refused.text
    assert "this model is a gguf file: deploy it with engine llamacpp" in refused.text

    made = api.post("/deployments", json={"name": "gguf-chat", "model": "gguf-q4", "engine": "llamacpp", "seq": 256})
    assert made.status_code == 201, made.text
    wait_for(ready(api, "gguf-chat"), timeout=120, what="gguf-chat to be ready")

    client = openai.OpenAI(base_url=stack.url + "v1", api_key=stack.token, max_retries=0)
    assert "gguf-chat" in {m.id for m in client.models.list()}
    since = int(time.time()) - 60
    greedy = dict(max_tokens=8, temperature=0)
    done = client.completions.create(model="gguf-chat", prompt="the cat sat", **greedy)
    assert done.usage.prompt_tokens >= 1 and done.usage.completion_tokens >= 1
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="gguf-chat", prompt="the cat sat", stream=True, **greedy) if c.choices)
    assert streamed == done.choices[0].text
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model="gguf-chat", messages=messages, **greedy)
    chunks = list(client.chat.completions.create(model="gguf-chat", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **greedy))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    # The engine's own counts reach the usage API, as any engine's do.
    spent = done.usage.total_tokens + chat.usage.total_tokens + chunks[-1].usage.total_tokens

    def counted():
        body = api.get(f"/usage?group=deployment&deployment=gguf-chat&since={since}").json()
        totals = body["totals"]
        return totals["prompt_tokens"] + totals["completion_tokens"] >= spent and totals

    wait_for(counted, timeout=30, what="the usage API to count gguf-chat's tokens")

    # auto runs it on the engine that reads its format.
    made = api.post("/deployments", json={"name": "gguf-auto", "model": "gguf-q4", "seq": 256})
    assert made.status_code == 201, made.text
    wait_for(ready(api, "gguf-auto"), timeout=120, what="gguf-auto to be ready")
    assert client.completions.create(model="gguf-auto", prompt="the cat sat", **greedy).choices[0].text == \
        done.choices[0].text
    for name in ("gguf-chat", "gguf-auto"):
        assert api.delete(f"/deployments/{name}").status_code in (200, 204)
