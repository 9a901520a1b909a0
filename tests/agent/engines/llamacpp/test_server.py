"""The real llama-server on the tiny GGUF files (server.py): it starts, answers OpenAI completions and chats (streamed
too) behind its key on loopback, exposes /metrics, and says why when it cannot load a file."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from agent.engines.llamacpp import LlamacppEngine, convert
from agent.engines.llamacpp.server import EngineExited, LlamaServer, load
from agent.workers.spec import WorkerSpec

from .conftest import LLAMA_PYTHON, needs_server

pytestmark = needs_server
ENGINE = LlamacppEngine()


def _spec(path, **changes) -> WorkerSpec:
    from agent.protocol import DesiredReplica

    replica = DesiredReplica(id=1, deployment="tiny", model_path=str(path), architecture="llama", gpus=[],
                             reserved_bytes=1 << 30, seq=256, engine_args=["--parallel", "2"])
    started = ENGINE.command(replica, "cpu", 0, threads=1)
    return WorkerSpec(**({"replica_id": 1, "model_path": str(path), "task": "causal-lm", "deployment": "tiny",
                          "engine": "llamacpp", "engine_python": LLAMA_PYTHON, "engine_args": started.args,
                          "engine_env": started.env} | changes))


def _post(model, path: str, body: dict, key: str | None = None) -> urllib.request.Request:
    key = model.server.key if key is None else key
    return urllib.request.Request(model.server.base_url + path, data=json.dumps(body).encode(), method="POST",
                                  headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def _json(request: urllib.request.Request) -> dict:
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def _events(request: urllib.request.Request) -> list[dict]:
    with urllib.request.urlopen(request, timeout=60) as answer:
        lines = [line.decode().strip() for line in answer]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.fixture(scope="module", params=["Q8_0", "Q4_0"])
def served(request, ggufs):
    """A llama-server on one of the quantized tiny files."""
    model = load(_spec(ggufs[request.param]))
    yield model
    model.server.stop()


def test_it_reports_the_version_of_its_xllamacpp():
    import xllamacpp

    assert ENGINE.version(LLAMA_PYTHON) == xllamacpp.__version__


def test_it_answers_completions_behind_its_key(served):
    answer = _json(_post(served, "/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 4,
                                                     "temperature": 0, "ignore_eos": True}))
    assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] == 4
    assert isinstance(answer["choices"][0]["text"], str)
    with pytest.raises(urllib.error.HTTPError) as refused:
        _json(_post(served, "/v1/completions", {"prompt": "Hello", "max_tokens": 1}, key="wrong"))
    assert refused.value.code == 401


def test_it_answers_chats_with_the_files_template(served):
    answer = _json(_post(served, "/v1/chat/completions", {"model": "tiny", "max_tokens": 3, "temperature": 0,
                                                          "messages": [{"role": "user", "content": "Hi"}]}))
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["role"] == "assistant"
    # <s>, "<|user|>\nHi</s>\n", "<|assistant|>\n": the Zephyr-style template the file carries, rendered by it.
    assert answer["usage"]["prompt_tokens"] > 3


def test_it_streams_chats_and_completions(served):
    # ignore_eos, llama.cpp's own field, passes through: random weights may otherwise end at once.
    chunks = _events(_post(served, "/v1/chat/completions", {"max_tokens": 3, "stream": True, "ignore_eos": True,
                                                            "messages": [{"role": "user", "content": "Hi"}]}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # Random weights may pick ids the tiny vocabulary leaves unused (no text): its own count of tokens is the check.
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["timings"]["predicted_n"] == 3
    pieces = _events(_post(served, "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "stream": True,
                                                       "ignore_eos": True}))
    assert pieces[-1]["choices"][0]["finish_reason"] == "length" and pieces[-1]["timings"]["predicted_n"] == 3
    assert all(p["object"] == "text_completion" for p in pieces)


def test_it_tells_the_worker_its_port_key_and_context(served):
    told = served.describe()
    assert told["engine"] == "llamacpp" and told["port"] == served.server.port and told["key"] == served.server.key
    assert told["max_positions"] == 256  # its 2 slots share one KV cache of --ctx-size: one request may take it all
    assert served.measure()["peak_bytes"] > 0


def test_it_exposes_prometheus_metrics_the_agent_relays_labelled(served):
    from types import SimpleNamespace

    from agent.serving.engine_metrics import merge

    status, text = served.server.read("/metrics")
    assert status == 200 and "llamacpp:prompt_tokens_total" in text
    handle = SimpleNamespace(spec=SimpleNamespace(deployment="tiny", label="tiny#0"))
    assert 'llamacpp:prompt_tokens_total{deployment="tiny",replica="tiny#0"}' in merge([(handle, text)]).decode()


def test_its_metrics_give_an_endpoint_picker_requests_but_no_kv_usage(served):
    from agent.msp import llamacpp_load

    status, text = served.server.read("/metrics")
    load = llamacpp_load("tiny", text)
    assert status == 200 and (load.waiting, load.running) == (0, 0)
    # This llama.cpp reports no KV-cache use (kv_cache_usage_ratio is gone): the picker is told nothing.
    assert load.kv_usage is None and load.max_lora is None


def test_it_refuses_sleep_and_adapters_saying_why(served):
    from agent.engines.llamacpp.server import InputError

    with pytest.raises(InputError, match="no sleep mode"):
        served.commands["sleep"](None)
    refused = served.commands["adapters"]({"load": [{"name": "a", "path": "/x"}], "unload": []})
    assert "takes no adapters at runtime" in refused["failures"]["a"]


def test_a_file_missing_a_tensor_fails_its_start_with_llama_cpps_own_reason(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(convert, "_TOP_TENSORS", {k: v for k, v in convert._TOP_TENSORS.items()
                                                  if v != "output_norm.weight"})
    broken = convert.write_gguf(tiny_llama, tmp_path / "broken.gguf", "Q8_0")
    with pytest.raises(EngineExited) as failed:
        load(_spec(broken))
    assert "before it was ready" in str(failed.value)
    assert str(failed.value).endswith(": check_tensor_dims: tensor 'output_norm.weight' not found")


def test_a_file_cut_short_fails_its_start_saying_so(ggufs, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = ggufs["Q8_0"].read_bytes()
    cut.write_bytes(data[: len(data) - 4096])
    server = LlamaServer(_spec(cut))
    server.start()
    with pytest.raises(EngineExited) as failed:
        server.wait_healthy(timeout=60)
    server.stop()
    assert "llama-server exited with code 1 before it was ready: " in str(failed.value)
    # llama.cpp's own line: its loader's reason, or, when its log thread had not written that out before the exit
    # (seen once in a clean-clone run), its server's last word.
    said = str(failed.value).split("before it was ready: ", 1)[1]
    assert "data is not within the file bounds" in said or said == "error: Failed to init server, please check the " \
        "input params."
