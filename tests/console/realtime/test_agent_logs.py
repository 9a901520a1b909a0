"""Worker logs over the agent link: a caller's logs request reaches the host's agent, and the agent's answer reaches
that caller (and no one else); an answer the link did not ask for is dropped; an agent that does not answer is a
timeout that says so (console/fleet/logs.py and the AgentConsumer)."""

import asyncio
import contextlib
import json
import os

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from console.asgi import application
from console.catalog.models import Model
from console.control import agent_link as consumers
from console.deployments.models import Deployment, Replica
from console.errors import AgentRefused, AgentTimeout, Unavailable
from console.fleet import logs
from console.fleet.logs import replica_logs
from console.fleet.models import AgentCredential, Host
from tests.console.realtime.agent_link import GPU, HELLO, linked

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.db_stack]


@pytest.fixture
def token():
    return AgentCredential.issue("h1")[1]


@pytest.fixture
def tiny(model_dir):
    from console.catalog.services import register_model

    return register_model("tiny", str(model_dir))


@database_sync_to_async
def place_replica(index: int = 0) -> int:
    """Replica `index` of deployment chat, placed on h1 (connected by then); its id."""
    dep, _ = Deployment.objects.get_or_create(name="chat", defaults={"model": Model.objects.get(name="tiny")})
    return Replica.objects.create(deployment=dep, index=index, host=Host.objects.get(name="h1")).pk


async def next_request(comm) -> dict:
    request = json.loads(await comm.receive_from(timeout=5))
    assert request["type"] == "logs_request", request
    return request


async def test_a_logs_request_reaches_the_agent_and_its_answer_reaches_the_caller(token, tiny):
    comm = await linked(token)
    try:
        replica_id = await place_replica()
        caller = asyncio.create_task(replica_logs("chat", 0, 5))
        request = await next_request(comm)
        assert request == {"type": "logs_request", "request_id": request["request_id"], "replica_id": replica_id,
                           "tail": 5}
        await comm.send_to(text_data=json.dumps({"type": "logs", "request_id": request["request_id"],
                                                 "replica_id": replica_id, "lines": ["loading", "ready"]}))
        assert await asyncio.wait_for(caller, 5) == ["loading", "ready"]

        # The agent's own refusal is passed on in its words.
        caller = asyncio.create_task(replica_logs("chat", 0, 100))
        request = await next_request(comm)
        await comm.send_to(text_data=json.dumps({"type": "logs", "request_id": request["request_id"],
                                                 "replica_id": replica_id, "error": "no log of replica 1 here"}))
        with pytest.raises(AgentRefused, match="the agent on h1 says: no log of replica 1 here") as refused:
            await asyncio.wait_for(caller, 5)
        assert refused.value.status == 502
        assert await comm.receive_nothing(timeout=0.1)  # no error reply: both answers were wanted
    finally:
        await comm.disconnect()


async def test_an_answer_the_link_did_not_ask_for_is_dropped_and_the_caller_times_out(token, tiny, monkeypatch,
                                                                                     caplog):
    monkeypatch.setattr(logs, "REPLY_TIMEOUT", 1.0)
    comm = await linked(token)
    try:
        replica_id = await place_replica()
        caller = asyncio.create_task(replica_logs("chat", 0, 10))
        request = await next_request(comm)
        for answer in ({"request_id": "made-up", "replica_id": replica_id},  # a request this link never sent
                       {"request_id": request["request_id"], "replica_id": replica_id + 1}):  # another replica
            await comm.send_to(text_data=json.dumps({"type": "logs", "lines": ["forged"], **answer}))
        with pytest.raises(AgentTimeout, match="the agent on h1 did not answer within 1 s") as timed_out:
            await caller
        assert timed_out.value.status == 504
        assert caplog.text.count("dropped a logs reply to no request of this link") == 2

        # An answer is passed on once: the same answer again is dropped too.
        caller = asyncio.create_task(replica_logs("chat", 0, 10))
        request = await next_request(comm)
        answer = json.dumps({"type": "logs", "request_id": request["request_id"], "replica_id": replica_id,
                             "lines": ["real"]})
        await comm.send_to(text_data=answer)
        assert await asyncio.wait_for(caller, 5) == ["real"]
        await comm.send_to(text_data=answer)
        await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 0}))  # the link still takes messages
        assert await comm.receive_nothing(timeout=0.2)
        assert caplog.text.count("dropped a logs reply to no request of this link") == 3
    finally:
        await comm.disconnect()


async def test_an_agent_that_never_answers_such_as_an_older_one_is_a_timeout_that_says_so(token, tiny, monkeypatch):
    monkeypatch.setattr(logs, "REPLY_TIMEOUT", 0.5)
    comm = await linked(token)
    try:
        await place_replica()
        caller = asyncio.create_task(replica_logs("chat", 0, 10))
        await next_request(comm)  # an older agent logs a message it cannot validate, and says nothing
        with pytest.raises(AgentTimeout, match="or older than this console and unable to serve logs"):
            await caller
    finally:
        await comm.disconnect()


async def test_another_hosts_agent_cannot_answer_a_request_it_was_not_sent(token, tiny, monkeypatch, caplog):
    monkeypatch.setattr(logs, "REPLY_TIMEOUT", 1.0)
    other_token = await database_sync_to_async(lambda: AgentCredential.issue("h2")[1])()
    comm = await linked(token)
    other = WebsocketCommunicator(application, "/ws/agent/",
                                  headers=[(b"authorization", f"Bearer {other_token}".encode())])
    try:
        assert (await other.connect())[0]
        await other.send_to(text_data=json.dumps(HELLO | {"host": "h2", "gpus": [GPU | {"uuid": "SIM-h2-0"}]}))
        assert json.loads(await other.receive_from(timeout=5))["type"] == "desired_state"
        replica_id = await place_replica()
        caller = asyncio.create_task(replica_logs("chat", 0, 10))
        request = await next_request(comm)
        await other.send_to(text_data=json.dumps({"type": "logs", "request_id": request["request_id"],
                                                  "replica_id": replica_id, "lines": ["forged by h2"]}))
        with pytest.raises(AgentTimeout):
            await caller
        assert "agent h2: dropped a logs reply to no request of this link" in caplog.text
    finally:
        await other.disconnect()
        await comm.disconnect()


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="the Redis channel layer (PostgreSQL + Redis pass)")
async def test_with_redis_the_answer_reaches_the_console_process_that_asked(token, tiny, monkeypatch):
    from console.realtime.redis_layer import ChannelLayer

    # The caller in another console process: a layer of its own (its own client prefix), while the agent's link
    # is held by this process's.
    elsewhere = ChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    monkeypatch.setattr(logs, "get_channel_layer", lambda: elsewhere)
    comm = await linked(token)
    try:
        replica_id = await place_replica()
        caller = asyncio.create_task(replica_logs("chat", 0, 5))
        request = await next_request(comm)
        await comm.send_to(text_data=json.dumps({"type": "logs", "request_id": request["request_id"],
                                                 "replica_id": replica_id, "lines": ["from the agent"]}))
        assert await asyncio.wait_for(caller, 5) == ["from the agent"]
    finally:
        await comm.disconnect()
        await elsewhere.close_pools()


async def test_a_link_with_too_many_requests_waiting_refuses_the_next_at_once(token, tiny, monkeypatch):
    monkeypatch.setattr(consumers, "LOG_REQUESTS", 1)
    comm = await linked(token)
    try:
        await place_replica()
        waiting = asyncio.create_task(replica_logs("chat", 0, 10))
        await next_request(comm)  # not answered yet
        with pytest.raises(Unavailable, match="the link to the agent on h1 already has 1 logs requests waiting") as e:
            await asyncio.wait_for(replica_logs("chat", 0, 10), 5)
        assert e.value.status == 503 and await comm.receive_nothing(timeout=0.1)  # the agent never heard of it
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    finally:
        await comm.disconnect()
