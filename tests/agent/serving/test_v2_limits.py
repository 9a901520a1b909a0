"""What one v2 (or /v1) request may ask of the agent: body size and nesting, sequence length against the model's
positions, tokens per request, attention-mask values; and large answers streamed as they are encoded."""

import json
import math
import time

import numpy as np
import pytest

from agent.serving.body import MAX_DEPTH
from agent.serving.tensors import ENCODE_CHUNK_VALUES, MAX_REQUEST_TOKENS
from agent.workers.spec import WorkerSpec

VOCAB = 8


class FakeReplica:
    """A ready replica whose logits[b, s, v] are id * 10 + v (or `logits` when given)."""

    def __init__(self, deployment="chat", path=None, task="causal-lm", info=None, logits=None):
        self.spec = WorkerSpec(1, str(path or f"/models/{deployment}"), task, deployment=deployment)
        self.state, self.reason, self.queued, self.adapters = "ready", "", 0, set()
        self.info = {"output_dim": VOCAB} if info is None else info
        self.logits = logits
        self.seen = []

    async def infer(self, inputs, adapters=None):
        self.seen.append(inputs)
        if self.logits is not None:
            return {"logits": self.logits}
        return {"logits": (inputs["input_ids"][..., None] * 10 + np.arange(VOCAB)).astype(np.float32)}


def ids_body(shape, data=None, **inputs):
    data = data if data is not None else [1] * math.prod(shape)
    tensors = [{"name": "input_ids", "shape": shape, "datatype": "INT64", "data": data}]
    tensors += [{"name": name, "shape": shape, "datatype": "INT64", "data": d} for name, d in inputs.items()]
    return {"inputs": tensors}


def write_config(path, **config):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


async def test_a_sequence_past_a_causal_lms_positions_is_a_400_naming_the_limit_at_once(serve):
    chat = FakeReplica(info={"output_dim": VOCAB, "max_positions": 256})
    client = await serve(chat)
    started = time.monotonic()
    # Only three values: the shape alone is refused, before any data is counted or converted.
    response = await client.post("/v2/models/chat/infer", json=ids_body([1, 10_000_000], [1, 2, 3]))
    assert time.monotonic() - started < 1
    assert response.status == 400
    assert (await response.json())["error"] == (
        "input 'input_ids' has shape [1, 10000000]: sequences of 10000000 tokens, but this model takes at most 256 "
        "(its max_position_embeddings)"
    )
    assert chat.seen == []
    assert (await client.post("/v2/models/chat/infer", json=ids_body([1, 256]))).status == 200


@pytest.mark.parametrize(
    ("config", "limit"),
    [({"model_type": "llama", "max_position_embeddings": 128}, 128), ({"model_type": "gpt2", "n_positions": 64}, 64)],
)
async def test_without_a_reported_limit_the_models_config_gives_it(serve, tmp_path, config, limit):
    chat = FakeReplica(path=write_config(tmp_path / "model", **config))  # its info names no max_positions
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", json=ids_body([2, limit + 1]))
    assert response.status == 400 and f"this model takes at most {limit} " in (await response.json())["error"]
    assert (await client.post("/v2/models/chat/infer", json=ids_body([2, limit]))).status == 200
    assert [s["input_ids"].shape for s in chat.seen] == [(2, limit)]


async def test_more_tokens_than_one_request_may_carry_is_a_400_naming_the_budget(serve):
    chat = FakeReplica()
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", json=ids_body([65, 256], [1]))
    assert response.status == 400
    assert (await response.json())["error"] == (
        f"input 'input_ids' has shape [65, 256]: 16640 tokens, over the {MAX_REQUEST_TOKENS} tokens (rows x sequence) "
        "one request may carry; split it into smaller requests"
    )
    assert chat.seen == []
    assert (await client.post("/v2/models/chat/infer", json=ids_body([64, 256]))).status == 200


async def test_attention_mask_values_other_than_0_and_1_are_a_400(serve):
    chat = FakeReplica()
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", json=ids_body([1, 3], attention_mask=[1, 2, 0]))
    assert response.status == 400
    assert (await response.json())["error"] == (
        "input 'attention_mask' holds 2; its values must be 0 (padding) or 1 (a token)"
    )
    assert chat.seen == []
    assert (await client.post("/v2/models/chat/infer", json=ids_body([1, 3], attention_mask=[1, 1, 0]))).status == 200


HUGE = b'{"inputs": [' + b"1, " * (35 * 1024 * 1024) + b"1]}"  # 105 MB


def deep_body(levels=100_000):
    return b'{"model": "chat", "prompt": ' + b"[" * levels + b"]" * levels + b"}"


async def test_a_100_mb_body_is_a_413_naming_the_limit(serve):
    chat = FakeReplica()
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", data=HUGE, headers={"Content-Type": "application/json"})
    assert response.status == 413
    assert (await response.json())["error"] == (
        f"the request body is {len(HUGE)} bytes; this server takes at most 16777216 bytes (16 MiB)"
    )
    assert chat.seen == []


async def test_a_body_nested_100000_deep_is_a_400_naming_the_depth_limit(serve):
    chat = FakeReplica()
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", data=deep_body())
    assert response.status == 400
    assert (await response.json())["error"] == (
        f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep, the most this server takes"
    )
    assert chat.seen == []


async def test_v1_a_100_mb_body_is_a_413_naming_the_limit(serve):
    client = await serve(FakeReplica())
    response = await client.post("/v1/completions", data=HUGE, headers={"Content-Type": "application/json"})
    assert response.status == 413 and "16777216 bytes" in (await response.json())["error"]["message"]


async def test_v1_a_body_nested_100000_deep_is_a_400_naming_the_depth_limit(serve):
    client = await serve(FakeReplica())
    response = await client.post("/v1/completions", data=deep_body())
    assert response.status == 400
    assert f"more than {MAX_DEPTH} levels deep" in (await response.json())["error"]["message"]


async def test_a_large_answer_is_streamed_and_reads_as_one_json_dumps_would_write_it(serve):
    logits = np.random.default_rng(0).standard_normal((3, 50, 1000)).astype(np.float32)
    logits[0, 0, :4] = [np.nan, np.inf, -np.inf, -0.0]  # as json.dumps writes them: NaN, Infinity, -Infinity, -0.0
    assert logits.size > 2 * ENCODE_CHUNK_VALUES
    client = await serve(FakeReplica(logits=logits))
    response = await client.post("/v2/models/chat/infer", json={**ids_body([3, 50]), "id": "big"})
    assert response.status == 200
    assert response.headers["Transfer-Encoding"] == "chunked"  # written as encoded, never whole in memory
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    expected = {
        "model_name": "chat",
        "id": "big",
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [3, 50, 1000], "data": logits.ravel().tolist()}],
    }
    assert await response.read() == json.dumps(expected).encode()


async def test_a_small_answer_keeps_its_content_length(serve):
    client = await serve(FakeReplica())
    response = await client.post("/v2/models/chat/infer", json={**ids_body([1, 2], [3, 4]), "id": "small"})
    assert response.status == 200 and "Content-Length" in response.headers
    expected = (np.array([3, 4])[:, None] * 10 + np.arange(VOCAB)).ravel().tolist()
    assert await response.json() == {
        "model_name": "chat",
        "id": "small",
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [1, 2, VOCAB], "data": expected}],
    }
