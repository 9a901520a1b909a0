"""Triton's model configuration and repository index on the agent, the one version each model has, and errors
in JSON on every v2 path, over fake replicas."""

import pytest

from agent.serving.batching import BatchSettings
from agent.serving.tensors import MAX_REQUEST_TOKENS
from tests.agent.serving.test_app import VOCAB, FakeReplica, ids_body


class Positioned(FakeReplica):
    """A ready replica whose worker reported the model's longest sequence, and its deployment's batching."""

    def __init__(self, *args, max_positions=128, batching=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.info["max_positions"] = max_positions
        self.batching = batching


async def test_the_model_configuration_is_tritons_with_the_batch_dimension_left_out(serve):
    chat = Positioned(1, "chat", batching=BatchSettings(max_batch_size=4, max_delay=0.002))
    client = await serve(chat, Positioned(2, "embed", "encoder", max_positions=512))
    response = await client.get("/v2/models/chat/config")
    assert response.status == 200, await response.text()
    config = await response.json()
    assert config["name"] == "chat" and config["max_batch_size"] == MAX_REQUEST_TOKENS // 128
    assert config["input"] == [
        {"name": "input_ids", "data_type": "TYPE_INT64", "format": "FORMAT_NONE", "dims": [-1],
         "is_shape_tensor": False, "optional": False},
        {"name": "attention_mask", "data_type": "TYPE_INT64", "format": "FORMAT_NONE", "dims": [-1],
         "is_shape_tensor": False, "optional": True},
    ]
    assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [-1, VOCAB],
                                 "is_shape_tensor": False}]
    assert config["dynamic_batching"] == {"preferred_batch_size": [4], "max_queue_delay_microseconds": 2000}
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert config["parameters"]["max_sequence_length"] == {"string_value": "128"}
    embed = await (await client.get("/v2/models/embed/versions/1/config")).json()
    assert [t["name"] for t in embed["input"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert embed["output"][0]["dims"] == [4] and embed["max_batch_size"] == MAX_REQUEST_TOKENS // 512
    # The metadata agrees: its shapes are the configuration's with the batch dimension first.
    metadata = await (await client.get("/v2/models/chat")).json()
    assert metadata["versions"] == ["1"] and metadata["outputs"][0]["shape"] == [-1, -1, VOCAB]


async def test_the_one_version_answers_as_the_plain_paths_and_another_is_a_404(serve):
    client = await serve(FakeReplica(1, "chat"))
    assert (await (await client.get("/v2/models/chat/versions/1")).json())["name"] == "chat"
    assert await (await client.get("/v2/models/chat/versions/1/ready")).json() == {"name": "chat", "ready": True}
    response = await client.post("/v2/models/chat/versions/1/infer", json=ids_body([1, 2], [1, 2]))
    assert response.status == 200 and (await response.json())["outputs"][0]["shape"] == [1, 2, VOCAB]
    for method, path in (("GET", "/v2/models/chat/versions/2"), ("GET", "/v2/models/chat/versions/2/config"),
                         ("GET", "/v2/models/chat/versions/2/ready"), ("POST", "/v2/models/chat/versions/2/infer")):
        response = await client.request(method, path, json=ids_body([1], [1, 1]))
        assert response.status == 404
        assert (await response.json())["error"] == "model 'chat' has no version '2': each model here has one " \
                                                   "version, '1'"


async def test_the_repository_index_lists_each_model_with_its_state_and_why(serve):
    client = await serve(FakeReplica(1, "chat"), FakeReplica(2, "slow", state="loading"),
                         FakeReplica(3, "gone", state="failed", reason="OSError: disk gone"),
                         FakeReplica(4, "tuned", adapters={"pirate"}))
    response = await client.post("/v2/repository/index", data=b"")  # as tritonclient sends it
    assert response.status == 200, await response.text()
    assert await response.json() == [
        {"name": "chat", "version": "1", "state": "READY", "reason": ""},
        {"name": "gone", "version": "1", "state": "UNAVAILABLE",
         "reason": "model 'gone' is not ready: replica 3 of 'gone' is failed: OSError: disk gone"},
        {"name": "pirate", "version": "1", "state": "READY", "reason": ""},
        {"name": "slow", "version": "1", "state": "LOADING",
         "reason": "model 'slow' is not ready: replica 2 of 'slow' is loading"},
        {"name": "tuned", "version": "1", "state": "READY", "reason": ""},
    ]
    ready = await (await client.post("/v2/repository/index", json={"ready": True})).json()
    assert [e["name"] for e in ready] == ["chat", "pirate", "tuned"]


@pytest.mark.parametrize(("body", "message"), [
    (b"[1]", 'the index request body must be a JSON object, such as {"ready": true}, or empty'),
    (b'{"ready": "yes"}', "'ready' must be true or false, got 'yes'"),
    (b"{nope", "the request body is not valid JSON"),
])
async def test_a_malformed_index_request_is_a_400_saying_what_is_wrong(serve, body, message):
    response = await (await serve(FakeReplica(1, "chat"))).post("/v2/repository/index", data=body)
    assert response.status == 400 and message in (await response.json())["error"]


async def test_server_metadata_names_the_model_configuration_extension(serve):
    meta = await (await (await serve()).get("/v2")).json()
    assert meta["extensions"] == ["binary_tensor_data", "model_configuration"]


async def test_a_wrong_method_on_a_v2_path_is_a_json_405_with_allow(serve):
    response = await (await serve(FakeReplica(1, "chat"))).put("/v2/models/chat/infer")
    assert response.status == 405 and response.headers["Allow"] == "POST"
    assert (await response.json())["error"] == "Method Not Allowed: PUT /v2/models/chat/infer"


async def test_a_bug_while_serving_is_a_json_500_not_a_text_page(serve):
    class Broken(FakeReplica):
        @property
        def adapters(self):
            raise RuntimeError("the replica broke")

        @adapters.setter
        def adapters(self, value):
            pass

    response = await (await serve(Broken(1, "chat"))).post("/v2/repository/index")
    assert response.status == 500
    assert (await response.json())["error"] == "internal error: RuntimeError: the replica broke"
