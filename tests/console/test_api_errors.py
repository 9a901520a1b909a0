"""A hostile probe of the console's routes (asgi.py's: the gateway for /v1 and /v2, Django for /api): every error
under /v1, /v2 and /api is JSON in that API's shape, never an HTML or plain-text page, with a token or without."""

from __future__ import annotations

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken
from console.asgi import django_asgi_app
from console.gateway.app import make_app
from console.gateway.core import Gateway
from console.gateway.metrics import ConsoleMetrics
from console.gateway.mount import GatewayPaths

pytestmark = pytest.mark.django_db(transaction=True)

PROBES = [
    ("GET", "/v1"), ("GET", "/v1/"), ("GET", "/v1/nope"), ("POST", "/v1/nope"), ("GET", "/v1/responses"),
    ("GET", "/v1/completions"), ("DELETE", "/v1/models"), ("PUT", "/v1/chat/completions"), ("GET", "/tokenize"),
    ("GET", "/v2/nope"), ("POST", "/v2"), ("PUT", "/v2/models/x/infer"), ("GET", "/v2/repository/index"),
    ("POST", "/v2/repository/models/x/load"), ("GET", "/v2/models/x/versions/1/nope"), ("GET", "/metrics/nope"),
    ("POST", "/metrics"),
    ("GET", "/api"), ("GET", "/api/"), ("GET", "/api/v1/nope"), ("GET", "/api/v2/hosts"), ("DELETE", "/api/v1/hosts"),
    ("PUT", "/api/v1/deployments"), ("PATCH", "/api/v1/events"), ("POST", "/api/v1/openapi.json"),
]


def shape(path: str) -> str:
    if path == "/v1" or path.startswith(("/v1/", "/tokenize")):
        return "openai"
    return "api" if path.startswith("/api") else "v2"


@pytest.fixture
async def console():
    def token() -> str:
        user, _ = get_user_model().objects.get_or_create(username="prober")
        return ApiToken.issue(user)[1]

    gateway = Gateway(metrics=ConsoleMetrics())
    routes = GatewayPaths(gateway=make_app(gateway), django=django_asgi_app)  # as console/asgi.py routes
    client = httpx.AsyncClient(transport=httpx.ASGITransport(routes), base_url="http://testserver", timeout=10)
    yield client, await sync_to_async(token)()
    await client.aclose()
    await gateway.close()


@pytest.mark.parametrize("with_token", [True, False], ids=["token", "no-token"])
async def test_every_error_under_the_api_paths_is_json_in_that_apis_shape(console, with_token):
    client, token = console
    headers = {"Authorization": f"Bearer {token}"} if with_token else {}
    pages = []
    for method, path in PROBES:
        response = await client.request(method, path, headers=headers)
        assert response.status_code >= 400, (method, path, response.status_code)
        if not response.headers.get("content-type", "").startswith("application/json"):
            pages.append(f"{method} {path}: {response.status_code} {response.headers.get('content-type')}")
            continue
        body, kind = response.json(), shape(path)
        if kind == "openai":
            assert set(body["error"]) == {"message", "type", "param", "code"}, (path, body)
        elif kind == "v2":
            assert isinstance(body["error"], str) and body["error"], (path, body)
        else:
            assert body["detail"] and {"loc", "msg", "type"} <= set(body["detail"][0]), (path, body)
    assert not pages, "answered with a page, not JSON:\n" + "\n".join(pages)


async def test_a_404_and_a_405_say_what_the_path_and_method_are_and_keep_allow(console):
    client, token = console
    headers = {"Authorization": f"Bearer {token}"}
    missing = await client.get("/v1/nope", headers=headers)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"].startswith("no such path: GET /v1/nope; the OpenAI-compatible API")
    assert missing.json()["error"]["code"] == "not_found"
    wrong = await client.get("/v1/completions", headers=headers)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["message"] == "GET is not allowed on /v1/completions; it takes POST"
    v2 = await client.put("/v2/models/x/infer", headers=headers)
    assert v2.status_code == 405 and v2.json() == {"error": "PUT is not allowed on /v2/models/x/infer; it takes POST"}
    api = await client.delete("/api/v1/hosts", headers=headers)
    assert api.status_code == 405 and "GET" in api.headers["allow"]
    assert api.json()["detail"][0]["type"] == "method_not_allowed"
    assert api.json()["detail"][0]["msg"].startswith("DELETE is not allowed on /api/v1/hosts; it takes ")
    unknown = await client.get("/api/v1/nope", headers=headers)
    assert unknown.status_code == 404 and unknown.json() == {"detail": [{
        "loc": [], "type": "not_found", "msg": "the API has no path GET /api/v1/nope; its paths are listed at "
                                               "/api/v1/docs (the OpenAPI schema: /api/v1/openapi.json)"}]}


async def test_pages_outside_the_api_stay_html(console):
    client, _ = console
    response = await client.get("/no-such-page/")
    assert response.status_code == 404 and response.headers["content-type"].startswith("text/html")
