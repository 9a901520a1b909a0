"""Triton's model configuration and repository index through the console: the configuration from the real agent
app (over fake replicas) with its host's secret, the index from the gateway's own picture of the fleet, the one
version each model has, and tritonclient's calls, as perf_analyzer makes them, against the console's routes."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from agent.serving.app import GatewayAuth
from agent.serving.app import make_app as agent_app
from console.accounts.models import ApiToken, Scope
from console.catalog.services import register_model
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.fleet.models import AgentCredential, Host
from console.gateway.app import make_app
from console.gateway.core import Gateway
from console.gateway.metrics import ConsoleMetrics
from tests.agent.serving.fake_app import FakeSource
from tests.agent.serving.test_app import VOCAB, FakeReplica
from tests.sockets import serve_on_loopback

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def fleet(model_dir):
    """Host h1 running the real agent app with a ready replica of `chat`; `cold` has no replica. Yields a client
    of the gateway with an API token, and the fake replica."""
    credential, _ = await sync_to_async(AgentCredential.issue)("h1")
    source = FakeSource()
    runner = web.AppRunner(agent_app(source, auth=GatewayAuth(credential.gateway_secret)))
    endpoint = await serve_on_loopback(runner)

    def rows() -> tuple[int, str]:
        host = Host.objects.create(name="h1", endpoint=endpoint, connected=True)
        register_model("tiny", str(model_dir))
        chat = create_deployment("chat", "tiny", min_replicas=1, max_replicas=1)
        create_deployment("cold", "tiny", min_replicas=0, max_replicas=1)
        replica = Replica.objects.create(deployment=chat, index=0, host=host, desired_state="ready",
                                         observed_state="ready")
        user, _ = get_user_model().objects.get_or_create(username="client")
        return replica.pk, ApiToken.issue(user, scope=Scope.INFERENCE)[1]

    replica_id, token = await sync_to_async(rows)()
    chat = FakeReplica(replica_id, "chat")
    chat.info["max_positions"] = 64
    source.replicas.append(chat)
    gateway = Gateway(metrics=ConsoleMetrics())
    client = httpx.AsyncClient(transport=httpx.ASGITransport(make_app(gateway)), base_url="http://gw",
                               headers={"Authorization": f"Bearer {token}"}, timeout=10)
    yield client, chat
    await client.aclose()
    await gateway.close()
    await runner.cleanup()


async def test_the_model_configuration_comes_from_a_replicas_agent_for_either_path(fleet):
    client, _ = fleet
    plain = await client.get("/v2/models/chat/config")
    assert plain.status_code == 200, plain.text
    assert plain.headers["x-modelgrid-replica"] == "chat#0"
    config = plain.json()
    assert config["name"] == "chat" and config["max_batch_size"] == 16384 // 64
    assert [t["name"] for t in config["input"]] == ["input_ids", "attention_mask"]
    assert config["output"][0]["dims"] == [-1, VOCAB]
    versioned = await client.get("/v2/models/chat/versions/1/config")
    assert versioned.status_code == 200 and versioned.json() == config
    assert (await client.get("/v2/models/chat/versions/1")).json()["versions"] == ["1"]


async def test_another_version_is_a_404_before_any_agent_is_asked(fleet):
    client, chat = fleet
    for method, path in (("GET", "/v2/models/chat/versions/7/config"), ("GET", "/v2/models/chat/versions/7"),
                         ("GET", "/v2/models/chat/versions/7/ready"), ("POST", "/v2/models/chat/versions/7/infer")):
        response = await client.request(method, path)
        assert response.status_code == 404, (path, response.text)
        assert response.json() == {"error": "model 'chat' has no version '7': each model here has one version, '1'"}
    assert not chat.seen
    assert (await client.get("/v2/models/chat/versions/1/ready")).json() == {"name": "chat", "ready": True}


async def test_the_repository_index_lists_every_model_with_its_state_and_what_a_request_gets(fleet):
    client, _ = fleet
    everything = await client.post("/v2/repository/index")  # no body, as tritonclient sends it
    assert everything.status_code == 200, everything.text
    assert everything.json() == [
        {"name": "chat", "version": "1", "state": "READY", "reason": ""},
        {"name": "cold", "version": "1", "state": "UNAVAILABLE", "reason": "cold: on disk; the next request loads it"},
    ]
    ready = await client.post("/v2/repository/index", json={"ready": True})
    assert [e["name"] for e in ready.json()] == ["chat"]
    bad = await client.post("/v2/repository/index", json={"ready": 1})
    assert bad.status_code == 400 and bad.json() == {"error": "'ready' must be true or false, got '1'"}
    anonymous = await client.post("/v2/repository/index", headers={"Authorization": ""})
    assert anonymous.status_code == 401


async def test_server_metadata_names_the_model_configuration_extension(fleet):
    client, _ = fleet
    assert (await client.get("/v2")).json()["extensions"] == ["binary_tensor_data", "model_configuration"]


async def test_load_and_unload_are_refused_saying_what_to_do_instead(fleet):
    client, _ = fleet
    for verb in ("load", "unload"):
        response = await client.post(f"/v2/repository/models/chat/{verb}")
        assert response.status_code == 400
        assert response.json()["error"].startswith(f"ModelGrid does not {verb} models on request: its scheduler")
    assert (await client.post("/v2/repository/models/chat/reload")).status_code == 404
