"""POST /v2/models/{name}/infer with Triton's binary tensor extension, over fake replicas: tritonclient's default
request gets a binary answer equal to the JSON one; large answers stream; every limit of the JSON path holds."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from tritonclient.http import InferInput, InferRequestedOutput, InferResult
from tritonclient.http._utils import _get_inference_request

from agent.serving.body import MAX_BODY_BYTES
from agent.serving.tensors import ENCODE_CHUNK_VALUES
from agent.workers.spec import WorkerSpec

VOCAB = 8
HEADER = "Inference-Header-Content-Length"


class FakeReplica:
    """A ready replica: logits[b, s, v] = id * 10 + v + 0.25 (causal LM), or embeddings[b, h] = sum(ids) / (h + 3)."""

    def __init__(self, deployment="chat", task="causal-lm", vocab=VOCAB, fixed=None):
        self.spec = WorkerSpec(1, f"/models/{deployment}", task, deployment=deployment)
        self.state, self.reason, self.queued, self.adapters = "ready", "", 0, set()
        self.vocab = vocab
        self.info = {"output_dim": vocab}
        self.fixed = fixed  # outputs to give whatever the inputs (made once, not on the loop per request)
        self.seen = []

    async def infer(self, inputs, adapters=None):
        self.seen.append(inputs)
        if self.fixed is not None:
            return self.fixed
        ids = inputs["input_ids"]
        if self.spec.task == "causal-lm":
            return {"logits": (ids[..., None] * 10 + np.arange(self.vocab) + 0.25).astype(np.float32)}
        return {"embeddings": (ids.sum(axis=1, keepdims=True) / (np.arange(4) + 3)).astype(np.float32)}


def triton_body(ids: np.ndarray, outputs=None, binary=True, **inputs) -> tuple[bytes, dict]:
    """The body and headers tritonclient.http's `infer` sends (binary inputs by default)."""
    tensors = []
    for name, array in {"input_ids": ids, **inputs}.items():
        tensor = InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    body, length = _get_inference_request(tensors, "", outputs, 0, False, False, 0, None, None)
    return body, ({} if length is None else {HEADER: str(length)})


async def answer(response) -> InferResult:
    """The response read as tritonclient.http reads it."""
    body = await response.read()
    assert response.status == 200, body[:500]
    length = response.headers.get(HEADER)
    return InferResult.from_response_body(body, header_length=None if length is None else int(length))


async def json_answer(client, model: str, ids: np.ndarray, output: str) -> np.ndarray:
    tensor = {"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64", "data": ids.ravel().tolist()}
    body = {"inputs": [tensor]}
    response = await client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status == 200 and HEADER not in response.headers
    return (await answer(response)).as_numpy(output)


async def test_tritonclients_default_request_gets_a_binary_answer_equal_to_the_json_one(serve):
    chat = FakeReplica()
    client = await serve(chat)
    ids = np.array([[1, 5, 42, 7], [3, 0, 2, 9]], dtype=np.int64)
    body, headers = triton_body(ids, attention_mask=np.array([[1, 1, 1, 1], [1, 1, 0, 0]]))
    response = await client.post("/v2/models/chat/infer", data=body, headers=headers)
    result = await answer(response)
    assert response.content_type == "application/octet-stream"
    [output] = result.get_response()["outputs"]
    assert output["parameters"] == {"binary_data_size": 2 * 4 * VOCAB * 4} and "data" not in output
    assert np.array_equal(result.as_numpy("logits"), await json_answer(client, "chat", ids, "logits"))
    assert chat.seen[0]["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


async def test_an_encoders_named_binary_output_is_binary(serve):
    client = await serve(FakeReplica("embed", task="encoder"))
    ids = np.array([[4, 5, 6]], dtype=np.int64)
    body, headers = triton_body(ids, outputs=[InferRequestedOutput("embeddings")])
    result = await answer(await client.post("/v2/models/embed/infer", data=body, headers=headers))
    assert result.get_response()["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert np.array_equal(result.as_numpy("embeddings"), await json_answer(client, "embed", ids, "embeddings"))


async def test_binary_inputs_with_json_outputs_get_a_plain_json_answer(serve):
    client = await serve(FakeReplica())
    ids = np.array([[2, 3]], dtype=np.int64)
    body, headers = triton_body(ids, outputs=[InferRequestedOutput("logits", binary_data=False)])
    response = await client.post("/v2/models/chat/infer", data=body, headers=headers)
    assert HEADER not in response.headers and response.content_type == "application/json"
    assert (await response.json())["outputs"][0]["data"][:2] == [20.25, 21.25]


async def test_json_inputs_may_ask_for_a_binary_answer(serve):
    client = await serve(FakeReplica())
    ids = np.array([[2, 3]], dtype=np.int64)
    body, headers = triton_body(ids, binary=False)  # no outputs named: binary_data_output
    assert headers == {}
    result = await answer(await client.post("/v2/models/chat/infer", data=body))
    assert np.array_equal(result.as_numpy("logits"), await json_answer(client, "chat", ids, "logits"))


async def test_a_large_binary_answer_streams_and_reads_back_whole(serve):
    chat = FakeReplica(vocab=1024)
    client = await serve(chat)
    ids = np.arange(64, dtype=np.int64).reshape(2, 32)  # 65,536 floats: past one encoding piece
    assert ids.size * 1024 > ENCODE_CHUNK_VALUES
    body, headers = triton_body(ids)
    response = await client.post("/v2/models/chat/infer", data=body, headers=headers)
    assert response.headers.get("Transfer-Encoding") == "chunked" and "Content-Length" not in response.headers
    result = await answer(response)
    assert np.array_equal(result.as_numpy("logits"), (ids[..., None] * 10 + np.arange(1024) + 0.25).astype("f4"))


async def test_the_loop_stays_free_while_a_large_binary_answer_is_written(serve):
    ids = np.ones((64, 256), dtype=np.int64)  # the most one request may carry: 16M floats, 64 MiB
    client = await serve(FakeReplica(vocab=1024, fixed={"logits": np.full((64, 256, 1024), 0.5, np.float32)}))
    body, headers = triton_body(ids)
    gaps, done = [], asyncio.Event()

    async def tick():
        last = asyncio.get_running_loop().time()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = asyncio.get_running_loop().time()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    response = await client.post("/v2/models/chat/infer", data=body, headers=headers)
    size = len(await response.read())
    done.set()
    await ticker
    assert response.status == 200 and size == int(response.headers[HEADER]) + 64 * 256 * 1024 * 4
    assert max(gaps) < 0.5, f"the event loop was held {max(gaps):.2f} s"


@pytest.mark.parametrize(
    ("headers", "body", "status", "message"),
    [
        ({HEADER: "500"}, b'{"inputs": []}', 400, "the Inference-Header-Content-Length header says the JSON header "
                                                    "is 500 bytes, but the body is 14 bytes"),
        ({HEADER: "ten"}, b'{"inputs": []}', 400, "must be the JSON header's length in bytes, got 'ten'"),
        ({HEADER: "4"}, b'{"inputs": []}', 400, "not valid JSON"),
        ({}, b'{"inputs": []}\x01\x02', 400, "not valid JSON"),
    ],
)
async def test_a_malformed_binary_body_is_a_400_naming_the_numbers(serve, headers, body, status, message):
    chat = FakeReplica()
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", data=body, headers=headers)
    assert response.status == status
    assert message in (await response.json())["error"]
    assert chat.seen == []


async def test_a_binary_data_size_that_disagrees_with_the_shape_is_a_400_naming_both(serve):
    chat = FakeReplica()
    client = await serve(chat)
    body, headers = triton_body(np.array([[1, 2, 3]], dtype=np.int64))
    body = body.replace(b'"binary_data_size":24', b'"binary_data_size":16')[:-8]
    headers = {HEADER: str(int(headers[HEADER]) + len('"binary_data_size":16') - len('"binary_data_size":24'))}
    response = await client.post("/v2/models/chat/infer", data=body, headers=headers)
    assert response.status == 400
    assert "input 'input_ids' has binary_data_size 16, but shape [1, 3] of INT64 needs 24 bytes" in (
        await response.json())["error"]


async def test_a_binary_body_is_held_to_the_json_bodys_size_and_value_limits(serve):
    chat = FakeReplica()
    client = await serve(chat)
    huge = await client.post("/v2/models/chat/infer", data=b"{}" + b"\0" * MAX_BODY_BYTES, headers={HEADER: "2"})
    assert huge.status == 413 and "at most 16777216 bytes" in (await huge.json())["error"]
    many = json.dumps({"inputs": [], "parameters": {f"k{i}": i for i in range(70_000)}}).encode()
    crowded = await client.post("/v2/models/chat/infer", data=many, headers={HEADER: str(len(many))})
    assert crowded.status == 413 and "JSON values" in (await crowded.json())["error"]
    assert chat.seen == []


async def test_the_tensor_bytes_are_never_parsed_as_json(serve):
    # 16,384 ids of 0x2c2c2c2c2c2c2c2c: 131,072 commas in the tensor bytes, twice the JSON values a body may hold.
    chat = FakeReplica()
    client = await serve(chat)
    ids = np.full((64, 256), 0x2C2C2C2C2C2C2C2C, dtype=np.int64)
    body, headers = triton_body(ids, outputs=[InferRequestedOutput("logits", binary_data=True)])
    assert body.count(b",") > 2 * 65536
    response = await client.post("/v2/models/chat/infer", data=body, headers=headers)
    assert response.status == 200
    assert np.array_equal(chat.seen[0]["input_ids"], ids)
