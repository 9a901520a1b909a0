"""The gateway and Triton's binary tensor extension on v2 infer: it reads only the JSON header of a binary body
(for parameters.adapter), never the raw tensor bytes, and passes Inference-Header-Content-Length to the agent
and back with the body unchanged."""

from __future__ import annotations

import json

import httpx
import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken
from console.catalog.services import register_model
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.fleet.models import AgentCredential, Host
from console.gateway.app import make_app
from console.gateway.core import Gateway, GatewaySettings
from console.gateway.metrics import ConsoleMetrics
from tests.sockets import serve_on_loopback

pytestmark = pytest.mark.django_db(transaction=True)
HEADER = "Inference-Header-Content-Length"
ANSWER_HEADER = b'{"model_name": "chat", "outputs": [{"name": "logits", "datatype": "FP32", "shape": [1, 1], ' \
                b'"parameters": {"binary_data_size": 4}}]}'


class BinaryAgent:
    """An agent's inference port that records each request and answers with a binary-extension body."""

    def __init__(self, secret: str) -> None:
        self.secret, self.seen = secret, []
        app = web.Application()
        app.router.add_post("/v2/models/{name}/infer", self.answer)
        self.runner = web.AppRunner(app)

    async def start(self) -> str:
        return await serve_on_loopback(self.runner)

    async def answer(self, request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == f"Bearer {self.secret}"
        self.seen.append((request.headers.get(HEADER), await request.read()))
        return web.Response(body=ANSWER_HEADER + b"\x00\x00\x80\x3f", content_type="application/octet-stream",
                            headers={HEADER: str(len(ANSWER_HEADER))})


@pytest.fixture
async def agent(model_dir):
    credential, _ = await sync_to_async(AgentCredential.issue)("h1")
    agent = BinaryAgent(credential.gateway_secret)
    endpoint = await agent.start()

    def rows():
        host = Host.objects.create(name="h1", endpoint=endpoint, connected=True)
        register_model("tiny", str(model_dir))
        dep = create_deployment("chat", "tiny", min_replicas=1, max_replicas=1)
        Replica.objects.create(deployment=dep, index=0, host=host, desired_state="ready", observed_state="ready")
        user, _ = get_user_model().objects.get_or_create(username="client")
        return ApiToken.issue(user)[1]

    agent.token = await sync_to_async(rows)()
    yield agent
    await agent.runner.cleanup()


async def post(agent: BinaryAgent, body: bytes, headers: dict) -> httpx.Response:
    gateway = Gateway(GatewaySettings(), ConsoleMetrics())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(make_app(gateway)), base_url="http://gw",
                                 headers={"Authorization": f"Bearer {agent.token}"}, timeout=10) as client:
        response = await client.post("/v2/models/chat/infer", content=body, headers=headers)
    await gateway.close()
    return response


def binary_body(header: dict, tensor_bytes: bytes) -> tuple[bytes, dict]:
    text = json.dumps(header).encode()
    return text + tensor_bytes, {HEADER: str(len(text))}


INPUTS = [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}}]
# Tensor bytes that hold the text '"adapter"' and are not JSON: the gateway must not look at them.
TENSOR_BYTES = b'"adapter"\xff\xfe{[' + b"\x00" * 3


async def test_a_binary_body_reaches_the_agent_unchanged_with_its_header_length_and_the_answer_comes_back(agent):
    body, headers = binary_body({"inputs": INPUTS}, TENSOR_BYTES)
    response = await post(agent, body, headers)
    assert response.status_code == 200, response.text
    assert agent.seen == [(headers[HEADER], body)]
    assert response.headers[HEADER] == str(len(ANSWER_HEADER))
    assert response.content == ANSWER_HEADER + b"\x00\x00\x80\x3f"
    assert response.headers["content-type"] == "application/octet-stream"


async def test_the_adapter_is_read_from_the_json_header_of_a_binary_body(agent):
    body, headers = binary_body({"inputs": INPUTS, "parameters": {"adapter": "nope"}}, TENSOR_BYTES)
    response = await post(agent, body, headers)
    assert response.status_code == 404, response.text
    assert response.json()["error"] == "model 'chat' has no adapter 'nope' (it has: none)"
    assert agent.seen == []


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ("999", "the Inference-Header-Content-Length header says the JSON header is 999 bytes, but the body is "),
        ("x1", "the Inference-Header-Content-Length header must be the JSON header's length in bytes, got 'x1'"),
    ],
)
async def test_a_header_length_the_body_cannot_have_is_a_400_naming_the_numbers(agent, declared, message):
    body, _ = binary_body({"inputs": INPUTS, "parameters": {"adapter": "a"}}, TENSOR_BYTES)
    response = await post(agent, body, {HEADER: declared})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert agent.seen == []
