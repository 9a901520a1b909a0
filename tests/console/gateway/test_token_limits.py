"""The gateway's side of token expiry, revocation and per-deployment scope: an expired token is refused at the
moment it expires even while its lookup is cached, a revoked one within the cache's bound, both with a 401 that
says why; a token limited to deployments gets 403 naming the deployment it may not call, and lists only its own."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.utils import timezone

from console.accounts.models import ApiToken, Scope
from console.catalog.services import register_model
from console.deployments.services import create_deployment
from console.fleet.models import AgentCredential, Host
from console.gateway.auth import Caller, TokenCache, lookup
from tests.console.gateway.test_gateway import INFER, FakeAgent, _client, _gateway, _ready_replica

pytestmark = pytest.mark.django_db(transaction=True)


def _issue(**fields) -> tuple[ApiToken, str]:
    user, _ = get_user_model().objects.get_or_create(username="client")
    return ApiToken.issue(user, "bot", **fields)


@pytest.fixture
async def two_deployments(model_dir):
    """Deployments `chat` and `embed`, each with one ready replica on host h1 and its fake agent."""
    credential, _ = await sync_to_async(AgentCredential.issue)("h1")
    agent = FakeAgent(credential.gateway_secret, "h1")
    endpoint = await agent.start()

    def rows():
        host = Host.objects.create(name="h1", endpoint=endpoint, connected=True)
        register_model("tiny", str(model_dir))
        for name in ("chat", "embed"):
            _ready_replica(create_deployment(name, "tiny", min_replicas=1, max_replicas=1), 0, host)

    await sync_to_async(rows)()
    yield agent
    await agent.runner.cleanup()


async def test_an_expired_token_is_refused_with_401_naming_when(two_deployments):
    when = timezone.now() - timedelta(minutes=1)
    _, token = await sync_to_async(_issue)(expires=when)
    gateway = _gateway()
    async with _client(gateway, token) as client:
        openai = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
        v2 = await client.post("/v2/models/chat/infer", json=INFER)
        listing = await client.get("/v1/models")
    await gateway.close()
    assert openai.status_code == v2.status_code == listing.status_code == 401
    assert openai.json()["error"]["message"].startswith("token expired at ")
    assert openai.json()["error"]["type"] == "authentication_error"
    assert v2.json()["error"].startswith("token expired at ") and "Bearer" in v2.headers["www-authenticate"]
    assert not two_deployments.seen


async def test_a_token_that_expires_while_its_lookup_is_cached_is_refused_at_once(two_deployments):
    _, token = await sync_to_async(_issue)(expires=timezone.now() + timedelta(seconds=1.5))
    gateway = _gateway()
    async with _client(gateway, token) as client:
        before = await client.get("/v1/models")
        await asyncio.sleep(1.6)
        after = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    await gateway.close()
    assert before.status_code == 200
    assert after.status_code == 401 and after.json()["error"]["message"].startswith("token expired at ")


async def test_a_revoked_token_is_refused_within_the_caches_bound(two_deployments, monkeypatch):
    monkeypatch.setattr("console.gateway.auth.CACHE_SECONDS", 0.3)
    row, token = await sync_to_async(_issue)()
    gateway = _gateway()
    async with _client(gateway, token) as client:
        assert (await client.get("/v1/models")).status_code == 200
        await sync_to_async(row.revoke)(actor="test")
        await asyncio.sleep(0.35)
        r = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
    await gateway.close()
    assert r.status_code == 401 and r.json()["error"]["message"].startswith("token revoked at ")
    assert not two_deployments.seen


async def test_a_token_limited_to_a_deployment_calls_it_and_gets_403_naming_another(two_deployments):
    _, token = await sync_to_async(_issue)(scope=Scope.INFERENCE, deployments=["chat"])
    gateway = _gateway()
    async with _client(gateway, token) as client:
        allowed = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
        other = await client.post("/v1/completions", json={"model": "embed", "prompt": "hi"})
        other_v2 = await client.post("/v2/models/embed/infer", json=INFER)
        ready = await client.get("/v2/models/embed/ready")
        card = await client.get("/v1/models/embed")
        listing = await client.get("/v1/models")
    await gateway.close()
    assert allowed.status_code == 200, allowed.text
    assert other.status_code == other_v2.status_code == ready.status_code == card.status_code == 403
    message = other.json()["error"]["message"]
    assert "'embed'" in message and "may only call chat" in message
    assert other.json()["error"]["type"] == "permission_error"
    assert "'embed'" in other_v2.json()["error"]
    assert [m["id"] for m in listing.json()["data"]] == ["chat"]
    assert [path for path, _ in two_deployments.seen] == ["/v1/completions"]  # only the allowed one went on


async def test_a_refusal_of_scope_is_not_counted_against_the_deployment(two_deployments):
    _, token = await sync_to_async(_issue)(scope=Scope.INFERENCE, deployments=["chat"])
    gateway = _gateway()
    async with _client(gateway, token) as client:
        await client.post("/v1/completions", json={"model": "embed", "prompt": "hi"})
    await gateway.close()
    # A 403 is the token's doing, not the deployment's: it must not count in the SLO loop's error rate.
    counted = {s.labels.get("deployment") for m in gateway.metrics.registry.collect() for s in m.samples}
    assert "embed" not in counted


async def test_the_cache_keeps_a_callers_expiry_and_limits():
    when = timezone.now() + timedelta(hours=1)
    seen = []

    async def fetch(token):
        seen.append(token)
        return Caller("k", "client", "inference", frozenset({"chat"}), when, "'bot' (abc…)")

    cache = TokenCache(fetch)
    first = await cache.caller("mg_api_x")
    again = await cache.caller("mg_api_x")
    assert first is again and seen == ["mg_api_x"]
    assert first.may_call("chat") and not first.may_call("embed")
    assert first.refusal(when - timedelta(seconds=1)) == ""
    assert first.refusal(when).startswith("token expired at ")


def test_lookup_says_whose_token_it_is_what_it_may_do_and_why_it_is_refused():
    _, inference = _issue(scope=Scope.INFERENCE, deployments=["chat"])
    _, full = _issue()
    found = lookup(inference)
    assert (found.user, found.scope, found.deployments, found.refused) == ("client", "inference", {"chat"}, "")
    assert lookup(full).scope == "all" and lookup(full).deployments == frozenset()
    row, revoked = _issue()
    row.revoke()
    assert lookup(revoked).refused.startswith("token revoked at ")


def test_lookup_knows_nobody_for_an_unknown_token_or_a_disabled_user():
    row, token = _issue()
    assert lookup("mg_api_nonsense") is None
    row.user.is_active = False
    row.user.save()
    assert lookup(token) is None
