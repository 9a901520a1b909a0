"""`GET /api/v1/deployments/{name}/replicas/{index}/logs?tail=N`: the lines from the replica's agent, and every
refusal in the API's one error shape with a message that says what to do."""

import asyncio
import json

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import AsyncClient, Client

from console.accounts.models import ApiToken
from console.catalog.services import register_model
from console.deployments.models import Deployment, Replica
from console.fleet import logs
from console.fleet.models import AgentCredential, Host
from tests.console.realtime.agent_link import linked
from tests.refusals import refusal

# The view reads the database on a thread of its own (PostgreSQL): the rows must be committed to be seen there.
pytestmark = pytest.mark.django_db(transaction=True)
URL = "/api/v1/deployments/chat/replicas/{}/logs"


@pytest.fixture
def chat(model):
    return Deployment.objects.create(name="chat", model=model)


def refused(response, status: int, kind: str) -> str:
    assert response.status_code == status, response.content
    assert response.json()["detail"][0]["type"] == kind
    return refusal(response)


def test_it_needs_a_token_or_a_session(user_client, chat):
    assert refused(Client().get(URL.format(0)), 401, "unauthorized")
    # A browser's session is enough: the same refusal as with a token, past the authentication.
    assert "has no replica 0" in refused(user_client.get(URL.format(0)), 404, "not_found")


def test_an_unknown_deployment_or_replica_is_a_404_that_names_the_replicas_there_are(api, chat, host):
    assert refused(api.get("/api/v1/deployments/ghost/replicas/0/logs"), 404, "not_found") == \
        "no deployment named 'ghost'"
    assert refused(api.get(URL.format(0)), 404, "not_found") == \
        "deployment 'chat' has no replica 0 (it has no replicas now)"
    Replica.objects.create(deployment=chat, index=1, host=host)
    Replica.objects.create(deployment=chat, index=2, host=host)
    assert refused(api.get(URL.format(5)), 404, "not_found") == \
        "deployment 'chat' has no replica 5 (its replicas are 1, 2)"


def test_a_replica_not_placed_is_a_409_with_the_schedulers_reason(api, chat):
    Replica.objects.create(deployment=chat, index=0, reason="no GPU has 9 GiB free")
    assert refused(api.get(URL.format(0)), 409, "conflict") == (
        "replica 0 of 'chat' is not placed on any host, so no worker of it has written a log yet: "
        "no GPU has 9 GiB free")


def test_a_replica_on_a_host_whose_agent_is_not_connected_is_a_503(api, chat, host):
    Host.objects.filter(pk=host.pk).update(connected=False)
    Replica.objects.create(deployment=chat, index=0, host=host)
    assert refused(api.get(URL.format(0)), 503, "unavailable") == (
        "host h1 is offline: its agent is not connected, so the log of replica 0 of 'chat' cannot be read until it "
        "reconnects")


def test_an_agent_that_does_not_answer_is_a_504(api, chat, host, monkeypatch):
    monkeypatch.setattr(logs, "REPLY_TIMEOUT", 0.2)
    Replica.objects.create(deployment=chat, index=0, host=host)  # connected, but no agent link in this test
    assert refused(api.get(URL.format(0)), 504, "timeout").startswith(
        "the agent on h1 did not answer within 0.2 s: it may be busy or reconnecting (try again)")


@pytest.mark.parametrize("query", ["?tail=0", "?tail=1001", "?tail=many"])
def test_a_tail_outside_1_to_1000_is_a_422_naming_it(api, chat, query):
    response = api.get(URL.format(0) + query)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "tail"]


def test_an_index_outside_what_a_replica_may_have_is_a_422(api, chat):
    assert api.get(URL.format(-1)).status_code == 422
    assert api.get(URL.format(2**31)).status_code == 422


async def get(url: str, token: str):
    # Each request in a context of its own, as Django's ASGI handler runs it: its sync middleware's thread is then
    # not the one the agent link's consumer needs meanwhile.
    async with ThreadSensitiveContext():
        try:
            return await AsyncClient().get(url, headers={"Authorization": f"Bearer {token}"})
        finally:
            await sync_to_async(connections.close_all)()  # that thread's, as the end of a request would


async def test_the_lines_come_from_the_replicas_agent(model_dir):
    def setup():
        user = get_user_model().objects.create_user("ops", password="unused-password-123")
        return register_model("tiny", str(model_dir)), AgentCredential.issue("h1")[1], ApiToken.issue(user)[1]

    model, agent_token, api_token = await database_sync_to_async(setup)()
    comm = await linked(agent_token)
    try:
        replica_id = await database_sync_to_async(lambda: Replica.objects.create(
            deployment=Deployment.objects.create(name="chat", model=model), index=0,
            host=Host.objects.get(name="h1")).pk)()
        answer = asyncio.create_task(get(URL.format(0) + "?tail=3", api_token))
        request = json.loads(await comm.receive_from(timeout=5))
        assert (request["type"], request["replica_id"], request["tail"]) == ("logs_request", replica_id, 3)
        await comm.send_to(text_data=json.dumps({"type": "logs", "request_id": request["request_id"],
                                                 "replica_id": replica_id, "lines": ["a", "b", "c"]}))
        response = await asyncio.wait_for(answer, 10)
        assert response.status_code == 200, response.content
        assert response.json() == {"lines": ["a", "b", "c"]}
    finally:
        await comm.disconnect()
