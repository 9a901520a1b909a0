"""The v2 REST endpoints over fake replicas (no worker processes)."""

import asyncio

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.serving import make_app
from agent.serving.auth import GatewayAuth
from agent.serving.batching import BatchSettings
from agent.workers.spec import WorkerSpec
from agent.workers.supervisor import (
    InferenceInputError,
    InferenceOutOfMemory,
    InferenceTimeout,
    WorkerUnavailable,
)
from tests.agent.serving.fake_app import AUTH, SECRET, FakeSource

VOCAB = 8


class FakeReplica:
    def __init__(self, replica_id, deployment, task="causal-lm", state="ready", reason="", raises=None, adapters=()):
        self.spec = WorkerSpec(replica_id, f"/models/{deployment}", task, deployment=deployment)
        self.state, self.reason, self.raises = state, reason, raises
        self.info = {"output_dim": VOCAB if task == "causal-lm" else 4}
        self.queued = 0
        self.adapters = set(adapters)
        self.seen, self.adapters_seen = [], []

    async def infer(self, inputs, adapters=None):
        self.seen.append(inputs)
        self.adapters_seen.append(adapters)
        if self.raises:
            raise self.raises
        ids = inputs["input_ids"]
        if self.spec.task == "causal-lm":
            # logits[b, s, v] = id * 10 + v: easy to check the row-major order
            return {"logits": (ids[..., None] * 10 + np.arange(VOCAB)).astype(np.float32)}
        return {"embeddings": np.full((ids.shape[0], 4), 0.5, dtype=np.float32)}


class WakingSource(FakeSource):
    """A source that could wake a replica (as the agent once did for requests): serving must never ask it to."""

    def __init__(self, *replicas):
        super().__init__(*replicas)
        self.woken = []

    async def wake(self, name):
        self.woken.append(name)
        for replica in self.replicas:
            if replica.spec.deployment == name and replica.state in ("sleeping", "preloaded"):
                replica.state = "ready"
                return replica
        raise AssertionError("no replica to wake")


def ids_body(data, shape, datatype="INT64", **extra):
    return {"inputs": [{"name": "input_ids", "shape": shape, "datatype": datatype, "data": data}], **extra}


async def test_it_is_live_and_describes_itself(serve):
    client = await serve()
    assert (await client.get("/v2/health/live")).status == 200
    meta = await (await client.get("/v2")).json()
    assert meta["name"] == "modelgrid-agent" and "binary_tensor_data" in meta["extensions"]


async def test_it_is_ready_only_when_every_replica_is(serve):
    client = await serve(FakeReplica(1, "chat"), FakeReplica(2, "embed", "encoder", state="loading"))
    response = await client.get("/v2/health/ready")
    assert response.status == 503
    assert (await response.json())["error"] == "not ready: replica 2 of 'embed' is loading"
    assert (await (await serve(FakeReplica(1, "chat"))).get("/v2/health/ready")).status == 200
    assert (await (await serve()).get("/v2/health/ready")).status == 200


async def test_it_gives_model_metadata_with_tensor_names_and_shapes(serve):
    client = await serve(FakeReplica(1, "chat"), FakeReplica(2, "embed", "encoder"))
    chat = await (await client.get("/v2/models/chat")).json()
    assert chat == {
        "name": "chat",
        "versions": ["1"],
        "platform": "pytorch",
        "inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
            {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]},
        ],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, -1, VOCAB]}],
    }
    embed = await (await client.get("/v2/models/embed")).json()
    assert [t["name"] for t in embed["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert embed["outputs"] == [{"name": "embeddings", "datatype": "FP32", "shape": [-1, 4]}]


async def test_it_says_whether_a_model_is_ready(serve):
    client = await serve(FakeReplica(1, "chat"), FakeReplica(2, "slow", state="loading"))
    assert await (await client.get("/v2/models/chat/ready")).json() == {"name": "chat", "ready": True}
    response = await client.get("/v2/models/slow/ready")
    assert response.status == 503 and "replica 2 of 'slow' is loading" in (await response.json())["error"]


async def test_it_runs_inference_and_returns_flat_row_major_fp32(serve):
    chat = FakeReplica(1, "chat")
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", json=ids_body([1, 2, 3, 4], [2, 2], id="req-7"))
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["model_name"] == "chat" and body["id"] == "req-7"
    [logits] = body["outputs"]
    assert logits["name"] == "logits" and logits["datatype"] == "FP32" and logits["shape"] == [2, 2, VOCAB]
    expected = (np.array([[1, 2], [3, 4]])[..., None] * 10 + np.arange(VOCAB)).ravel().tolist()
    assert logits["data"] == expected
    assert chat.seen[0]["input_ids"].dtype == np.int64 and chat.seen[0]["input_ids"].shape == (2, 2)


async def test_it_takes_nested_data_and_optional_inputs_and_outputs(serve):
    embed = FakeReplica(1, "embed", "encoder")
    client = await serve(embed)
    body = {
        "inputs": [
            {"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [[101, 7, 102]]},
            {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [[1, 1, 0]]},
            {"name": "token_type_ids", "shape": [1, 3], "datatype": "INT64", "data": [0, 0, 0]},
        ],
        "outputs": [{"name": "embeddings"}],
    }
    response = await client.post("/v2/models/embed/infer", json=body)
    assert response.status == 200, await response.text()
    [out] = (await response.json())["outputs"]
    assert out["shape"] == [1, 4] and out["data"] == [0.5] * 4
    assert embed.seen[0]["attention_mask"].tolist() == [[1, 1, 0]]
    assert (await response.json())["id"]  # one is made up when the client gave none


async def test_it_routes_to_the_least_busy_ready_replica(serve):
    busy, idle, loading = FakeReplica(1, "chat"), FakeReplica(2, "chat"), FakeReplica(3, "chat", state="loading")
    busy.queued = 3
    client = await serve(busy, idle, loading)
    assert (await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1]))).status == 200
    assert idle.seen and not busy.seen and not loading.seen


async def test_an_unknown_model_is_a_404_naming_it(serve):
    client = await serve(FakeReplica(1, "chat"))
    for method, path in (
        ("GET", "/v2/models/nope"),
        ("GET", "/v2/models/nope/ready"),
        ("POST", "/v2/models/nope/infer"),
    ):
        response = await client.request(method, path, json=ids_body([1], [1, 1]))
        assert response.status == 404
        assert await response.json() == {"error": "model 'nope' is not served by this agent (it serves: chat)"}


async def test_an_unknown_route_is_a_json_404(serve):
    response = await (await serve()).get("/v2/nothing/here")
    assert response.status == 404 and "error" in await response.json()


@pytest.mark.parametrize(
    ("state", "reason", "message"),
    [
        ("loading", "", "model 'chat' is not ready: replica 1 of 'chat' is loading"),
        (
            "failed",
            "OSError: disk gone",
            "model 'chat' is not ready: replica 1 of 'chat' is failed: OSError: disk gone",
        ),
    ],
)
async def test_a_model_that_is_not_ready_is_a_503_with_state_and_reason(serve, state, reason, message):
    client = await serve(FakeReplica(1, "chat", state=state, reason=reason))
    response = await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1]))
    assert response.status == 503
    assert await response.json() == {"error": message}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "the request body must be a JSON object with an 'inputs' list"),
        ({}, "'inputs' must be a non-empty list of tensors"),
        ({"inputs": [{"shape": [1, 1], "datatype": "INT64", "data": [1]}]}, "inputs[0].name must be a non-empty"),
        (ids_body([1.5], [1, 1], "FP32"), "input 'input_ids' must have datatype INT64, got 'FP32'"),
        (ids_body([1], [1, 1], "LONG"), "got 'LONG' (not a v2 datatype)"),
        (ids_body([1, 2, 3], [2, 2]), "input 'input_ids' has 3 values but shape [2, 2] needs 4"),
        (ids_body([1, 2], [2]), "input 'input_ids' must have shape [batch, sequence]"),
        (ids_body([1, 2], [1, "2"]), "input 'input_ids': 'shape' must be a list of non-negative integers"),
        (ids_body([1, 2.5], [1, 2]), "input 'input_ids' (INT64) must hold integers only"),
        (ids_body([1, True], [1, 2]), "must hold integers only"),
        (ids_body("1 2", [1, 2]), "input 'input_ids': 'data' must be a list"),
        (ids_body([1], [1, 1], outputs=[{"name": "hidden"}]), "outputs[0]: unknown output 'hidden'"),
        (
            {"inputs": [{"name": "attention_mask", "shape": [1, 1], "datatype": "INT64", "data": [1]}]},
            "missing input 'input_ids'",
        ),
        (
            {"inputs": [{"name": "pixels", "shape": [1, 1], "datatype": "INT64", "data": [1]}]},
            "unknown input 'pixels'; this model takes input_ids, attention_mask",
        ),
        (
            {
                "inputs": [
                    ids_body([1, 2], [1, 2])["inputs"][0],
                    {"name": "attention_mask", "shape": [1, 1], "datatype": "INT64", "data": [1]},
                ]
            },
            "input 'attention_mask' has shape [1, 1] but input_ids has [1, 2]",
        ),
    ],
)
async def test_a_malformed_request_is_a_400_naming_the_field(serve, body, message):
    client = await serve(FakeReplica(1, "chat"))
    response = await client.post("/v2/models/chat/infer", json=body)
    assert response.status == 400
    assert message in (await response.json())["error"]


async def test_a_body_that_is_not_json_is_a_400(serve):
    client = await serve(FakeReplica(1, "chat"))
    response = await client.post("/v2/models/chat/infer", data=b"{not json")
    assert response.status == 400 and "not valid JSON" in (await response.json())["error"]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InferenceInputError("input 'input_ids' holds 5000, outside this model's range [0, 8)"), 400),
        (WorkerUnavailable("replica 1: worker process was killed by signal SIGKILL"), 503),
        (InferenceTimeout("replica 1 did not answer within 120 s"), 504),
        (InferenceOutOfMemory("out of memory during infer on cuda:0: OutOfMemoryError: tried to allocate"), 507),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), 500),
    ],
)
async def test_worker_errors_map_to_statuses_with_their_message(serve, error, status):
    client = await serve(FakeReplica(1, "chat", raises=error))
    response = await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1]))
    assert response.status == status
    assert str(error) in (await response.json())["error"]


async def test_it_serves_concurrent_requests(serve):
    client = await serve(FakeReplica(1, "chat"))
    responses = await asyncio.gather(
        *(client.post("/v2/models/chat/infer", json=ids_body([i], [1, 1], id=str(i))) for i in range(10))
    )
    ids = [(await r.json())["id"] for r in responses]
    assert ids == [str(i) for i in range(10)]


async def test_concurrent_requests_share_one_padded_forward_and_get_their_own_logits(serve):
    chat = FakeReplica(1, "chat")
    client = await serve(chat, batching=BatchSettings(max_batch_size=3, max_delay=5))
    rows = [[1], [2, 3], [4, 5, 6]]
    async with asyncio.timeout(10):  # three rows cut the batch; the 5 s delay never runs out
        responses = await asyncio.gather(
            *(client.post("/v2/models/chat/infer", json=ids_body(r, [1, len(r)])) for r in rows)
        )
    for row, response in zip(rows, responses, strict=True):
        [logits] = (await response.json())["outputs"]
        assert logits["shape"] == [1, len(row), VOCAB]
        assert logits["data"] == (np.array([row])[..., None] * 10 + np.arange(VOCAB)).ravel().tolist()
    [batch] = chat.seen
    assert batch["input_ids"].tolist() == [[1, 0, 0], [2, 3, 0], [4, 5, 6]]


async def test_parameters_adapter_runs_the_request_with_that_adapter(serve):
    chat = FakeReplica(1, "chat", adapters={"fr"})
    client = await serve(chat)
    response = await client.post("/v2/models/chat/infer", json=ids_body([1, 2], [1, 2], parameters={"adapter": "fr"}))
    assert response.status == 200, await response.text()
    assert chat.adapters_seen == [["fr"]]
    # The adapter's own name addresses it as well.
    assert (await client.post("/v2/models/fr/infer", json=ids_body([1], [1, 1]))).status == 200
    assert chat.adapters_seen[-1] == ["fr"]


async def test_an_adapter_that_could_not_load_is_a_503_with_its_reason_not_a_client_error(serve):
    # The probe: a 400 "not loaded" from the worker, as if the client had asked for something wrong.
    chat = FakeReplica(1, "chat", adapters={"fr", "big"})
    chat.adapter_failures = {"big": "LoRA rank 600 is more than vLLM serves (512)"}
    client = await serve(chat)
    for path, parameters in (("/v2/models/chat/infer", {"adapter": "big"}), ("/v2/models/big/infer", {})):
        response = await client.post(path, json=ids_body([1], [1, 1], parameters=parameters))
        assert response.status == 503
        assert (await response.json())["error"] == ("adapter 'big' of model 'chat' could not be loaded: LoRA rank 600 "
                                                    "is more than vLLM serves (512)")
    assert chat.seen == []  # nothing reached the worker
    ok = await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1], parameters={"adapter": "fr"}))
    assert ok.status == 200


async def test_an_adapter_that_failed_on_one_replica_is_served_by_another_that_loaded_it(serve):
    failed, loaded = FakeReplica(1, "chat", adapters={"big"}), FakeReplica(2, "chat", adapters={"big"})
    failed.adapter_failures = {"big": "out of room"}
    client = await serve(failed, loaded)
    for _ in range(3):
        response = await client.post("/v2/models/big/infer", json=ids_body([1], [1, 1]))
        assert response.status == 200
    assert failed.seen == [] and len(loaded.seen) == 3


async def test_an_adapter_the_model_lacks_is_a_404_and_a_malformed_one_a_400(serve):
    client = await serve(FakeReplica(1, "chat", adapters={"fr"}))
    response = await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1], parameters={"adapter": "de"}))
    assert response.status == 404
    assert await response.json() == {"error": "model 'chat' has no adapter 'de' (it has: fr)"}
    response = await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1], parameters={"adapter": 7}))
    assert response.status == 400 and "parameters.adapter must be" in (await response.json())["error"]


async def test_metrics_are_scraped_in_the_text_format_after_requests(serve):
    client = await serve(FakeReplica(1, "chat", adapters={"fr"}), FakeReplica(2, "embed", "encoder", state="loading"))
    await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1]))
    await client.post("/v2/models/fr/infer", json=ids_body([1], [1, 1]))
    await client.post("/v2/models/chat/infer", json=ids_body([1.5], [1, 1], "FP32"))
    response = await client.get("/metrics")
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
    text = await response.text()
    for line in (
        'modelgrid_requests_total{adapter="",deployment="chat",status="200"} 1.0',
        'modelgrid_requests_total{adapter="fr",deployment="chat",status="200"} 1.0',
        'modelgrid_requests_total{adapter="",deployment="chat",status="400"} 1.0',
        'modelgrid_batch_size_count{deployment="chat"} 2.0',
        'modelgrid_replica_state{deployment="embed",replica="2",state="loading"} 1.0',
        'modelgrid_replica_state{deployment="chat",replica="1",state="ready"} 1.0',
    ):
        assert line in text


@pytest.mark.parametrize("state", ["sleeping", "preloaded"])
async def test_a_request_for_a_sleeping_or_preloaded_model_is_a_503_at_once_and_wakes_nothing(serve, state):
    # Only the console's desired state wakes or promotes a replica: a request never takes GPU memory.
    resting = FakeReplica(1, "chat", state=state)
    source = WakingSource(resting, FakeReplica(2, "other"))
    client = await serve(source=source)
    async with asyncio.timeout(5):
        response = await client.post("/v2/models/chat/infer", json=ids_body([1, 2], [1, 2]))
    assert response.status == 503
    assert await response.json() == {"error": f"model 'chat' is not ready: replica 1 of 'chat' is {state}"}
    assert source.woken == [] and resting.state == state and resting.seen == []


async def test_a_model_only_loading_or_failed_is_a_503_with_its_state(serve):
    source = WakingSource(FakeReplica(1, "chat", state="loading"))
    response = await (await serve(source=source)).post("/v2/models/chat/infer", json=ids_body([1], [1, 1]))
    assert response.status == 503 and source.woken == []
    assert "replica 1 of 'chat' is loading" in (await response.json())["error"]


async def test_sleeping_and_preloaded_replicas_do_not_make_the_host_unready(serve):
    client = await serve(FakeReplica(1, "chat"), FakeReplica(2, "a", state="sleeping"),
                         FakeReplica(3, "b", state="preloaded"), FakeReplica(4, "c", state="stopped"))
    assert (await client.get("/v2/health/ready")).status == 200
    assert (await client.get("/v2/models/a/ready")).status == 503  # not serving until the console wakes it


# --- only the console's gateway ---------------------------------------------------------------------

WRONG_SECRET = (
    "this agent serves only the ModelGrid console's gateway: send the gateway's secret as a bearer token "
    "(Authorization: Bearer <secret>)"
)
GUARDED = [
    ("GET", "/v2"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2/models/chat"),
    ("GET", "/v2/models/chat/ready"),
    ("POST", "/v2/models/chat/infer"),
    ("GET", "/metrics"),
    ("GET", "/v2/no/such/route"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/chat"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/no/such/route"),
]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": SECRET},
                                     {"Authorization": f"Basic {SECRET}"}, {"Authorization": f"Bearer {SECRET}x"},
                                     {"Authorization": "Bearer é"}])
async def test_without_the_gateway_secret_every_route_but_live_is_a_401(serve, headers):
    chat = FakeReplica(1, "chat")
    client = await serve(chat, headers=headers)
    for method, path in GUARDED:
        response = await client.request(method, path, json=ids_body([1], [1, 1]))
        assert response.status == 401, (method, path)
        assert response.headers["WWW-Authenticate"] == "Bearer"
        body = await response.json()
        if path.startswith("/v1/"):
            assert body == {"error": {"message": WRONG_SECRET, "type": "invalid_request_error", "param": None,
                                      "code": "invalid_gateway_secret"}}
        else:
            assert body == {"error": WRONG_SECRET}
    assert chat.seen == []
    live = await client.get("/v2/health/live")
    assert live.status == 200 and await live.json() == {"live": True}


async def test_with_the_gateway_secret_every_route_answers(serve):
    client = await serve(FakeReplica(1, "chat"))
    for method, path in (("GET", "/v2"), ("GET", "/v2/health/ready"), ("GET", "/v2/models/chat/ready"),
                         ("GET", "/metrics"), ("GET", "/v1/models"), ("GET", "/v2/health/live")):
        assert (await client.request(method, path)).status == 200, path
    assert (await client.post("/v2/models/chat/infer", json=ids_body([1], [1, 1]))).status == 200
    lowercase = await client.get("/v2", headers={"Authorization": f"bearer {SECRET}"})  # the scheme is any case
    assert lowercase.status == 200


async def test_metrics_need_the_gateway_secret(serve):
    client = await serve(FakeReplica(1, "chat"), headers={})
    assert (await client.get("/metrics")).status == 401
    response = await client.get("/metrics", headers=AUTH)
    assert response.status == 200 and "modelgrid_replica_state" in await response.text()


async def test_before_any_secret_arrives_everything_but_live_is_refused(serve):
    for secret in (None, ""):  # the app's default holder, and an empty secret from a console
        client = await serve(FakeReplica(1, "chat"), secret=secret, headers={"Authorization": "Bearer "})
        assert (await client.get("/v2/health/live")).status == 200
        response = await client.get("/v2/models/chat/ready")
        assert response.status == 401 and response.headers["WWW-Authenticate"] == "Bearer"
        message = (await response.json())["error"]
        assert "has no gateway secret yet" in message and "desired state from the console" in message
        response = await client.get("/v1/models")
        assert response.status == 401 and (await response.json())["error"]["code"] == "no_gateway_secret"


async def test_a_new_secret_replaces_the_old_one():
    auth = GatewayAuth("first")
    client = TestClient(TestServer(make_app(FakeSource(FakeReplica(1, "chat")), auth=auth)))
    await client.start_server()
    try:
        assert (await client.get("/v2", headers={"Authorization": "Bearer first"})).status == 200
        auth.set("second")
        assert (await client.get("/v2", headers={"Authorization": "Bearer first"})).status == 401
        assert (await client.get("/v2", headers={"Authorization": "Bearer second"})).status == 200
    finally:
        await client.close()
