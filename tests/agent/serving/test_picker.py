"""The endpoint picker's pages on the agent (agent.serving.picker): one per deployment on this host and one per
replica, each engine's figures under the protocol's names, and who may read them (agent.serving.auth)."""

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from agent.protocol import AdapterStatus
from agent.serving.auth import PickerAccess
from agent.workers.generation_spec import EngineStats
from agent.workers.spec import WorkerSpec
from tests.agent.test_msp import VLLM_PAGE

PICKER_TOKEN = "picker-token-for-tests-0123456789"


class Replica:
    """A serving replica as the picker's pages read it: its spec, state, worker figures and adapter pool."""

    def __init__(self, replica_id, deployment, index, state="ready", engine="torch", stats=EngineStats(), info=None,
                 adapters=()):
        self.spec = WorkerSpec(replica_id, f"/models/{deployment}", "causal-lm", deployment=deployment, index=index,
                               engine=engine)
        self.state, self.reason, self.draining = state, "", False
        self.engine_stats = stats
        self.info = {"kv_capacity_bytes": 1000} if info is None else info
        self.adapter_stats = list(adapters)
        self.adapters = {a.name for a in adapters}
        self.queued = 0


@pytest.fixture
async def vllm_server():
    """A stand-in for a vLLM server's /metrics: VLLM_PAGE, to its key only."""
    async def metrics(request):
        if request.headers.get("Authorization") != "Bearer vllm-key":
            return web.Response(status=401)
        return web.Response(text=VLLM_PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


async def page(client, path, status=200):
    response = await client.get(path)
    text = await response.text()
    assert response.status == status, text
    if status != 200:
        return text
    assert response.content_type == "text/plain"
    return {f.name: (f.type, [s.labels | {"value": s.value} for s in f.samples])
            for f in text_string_to_metric_families(text)}


async def test_a_deployments_page_is_its_serving_replicas_here_as_one_endpoint(serve):
    one = Replica(1, "chat", 0, stats=EngineStats(running=2, waiting=1, kv_cache_bytes=100, running_adapters=("fr",)),
                  adapters=[AdapterStatus(name="fr", tier="gpu", nbytes=10)])
    two = Replica(2, "chat", 1, stats=EngineStats(running=1, waiting=4, kv_cache_bytes=500))
    other = Replica(3, "embed", 0, stats=EngineStats(running=7))
    client = await serve(one, two, other)
    families = await page(client, "/msp/chat/metrics")
    assert families["vllm:num_requests_running"] == ("gauge", [{"model_name": "chat", "value": 3}])
    assert families["vllm:num_requests_waiting"] == ("gauge", [{"model_name": "chat", "value": 5}])
    assert families["vllm:kv_cache_usage_perc"][1][0]["value"] == pytest.approx(0.3)
    lora = families["vllm:lora_requests_info"][1][0]
    assert lora["running_lora_adapters"] == "fr" and lora["waiting_lora_adapters"] == ""


async def test_a_replicas_page_is_its_own(serve):
    client = await serve(Replica(1, "chat", 0, stats=EngineStats(running=2)),
                         Replica(2, "chat", 1, stats=EngineStats(running=5, kv_cache_bytes=900)))
    families = await page(client, "/msp/chat/1/metrics")
    assert families["vllm:num_requests_running"][1][0]["value"] == 5
    assert families["vllm:kv_cache_usage_perc"][1][0]["value"] == pytest.approx(0.9)
    assert "no replica on this host" in await page(client, "/msp/chat/7/metrics", status=503)


async def test_a_deployment_not_served_here_now_is_no_idle_endpoint(serve):
    client = await serve(Replica(1, "chat", 0, state="sleeping"))
    assert "is sleeping" in await page(client, "/msp/chat/metrics", status=503)
    assert "no replica on this host" in await page(client, "/msp/other/metrics", status=503)


async def test_a_vllm_replicas_figures_are_read_from_its_server_with_its_key(serve, vllm_server):
    vllm = Replica(1, "chat", 0, engine="vllm", info={"port": vllm_server.port, "key": "vllm-key"})
    client = await serve(vllm)
    families = await page(client, "/msp/chat/metrics")
    assert families["vllm:num_requests_waiting"] == ("gauge", [{"model_name": "chat", "value": 5}])
    assert families["vllm:kv_cache_usage_perc"][1][0]["value"] == 0.25
    assert families["vllm:cache_config_info"][1][0] | {"value": 1} == {
        "model_name": "chat", "block_size": "16", "num_gpu_blocks": "2048", "value": 1}
    assert families["vllm:lora_requests_info"][1][0]["running_lora_adapters"] == "fr,de"
    assert "vllm:prompt_tokens_total" not in families  # the protocol's series only
    vllm.info["key"] = "wrong"  # its server refuses: no figures rather than zeros
    assert "did not answer" in await page(client, "/msp/chat/metrics", status=503)


async def test_the_pages_need_the_gateways_secret_by_default(serve):
    client = await serve(Replica(1, "chat", 0), headers={})
    assert (await client.get("/msp/chat/metrics")).status == 401
    assert (await client.get("/msp/chat/metrics", headers={"Authorization": f"Bearer {PICKER_TOKEN}"})).status == 401


async def test_open_metrics_opens_the_pickers_pages_and_nothing_else(serve):
    client = await serve(Replica(1, "chat", 0), picker=PickerAccess(open_metrics=True), headers={})
    assert (await client.get("/msp/chat/metrics")).status == 200
    assert (await client.get("/msp/chat/0/metrics")).status == 200
    for path in ("/metrics", "/v1/models", "/v2/models/chat"):
        assert (await client.get(path)).status == 401, path
    assert (await client.post("/msp/chat/metrics")).status == 401


async def test_the_picker_token_opens_the_inference_api_a_pickers_gateway_relays_and_the_pages(serve):
    client = await serve(Replica(1, "chat", 0), picker=PickerAccess(token=PICKER_TOKEN),
                         headers={"Authorization": f"Bearer {PICKER_TOKEN}"})
    assert (await client.get("/msp/chat/metrics")).status == 200
    models = await client.get("/v1/models")
    assert models.status == 200 and [m["id"] for m in (await models.json())["data"]] == ["chat"]
    for path in ("/metrics", "/v2/models/chat", "/v2/repository/index"):
        response = await (client.post(path) if path.endswith("index") else client.get(path))
        assert response.status == 401, path
    assert (await client.get("/msp/chat/metrics", headers={"Authorization": "Bearer nope"})).status == 401
