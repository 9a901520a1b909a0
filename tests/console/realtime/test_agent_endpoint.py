"""An agent's hello whose endpoint is more than a base URL is refused with why, and nothing of it is stored: the
console never learns an endpoint that would choose what it fetches."""

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from console.asgi import application
from console.fleet.models import AgentCredential, Host
from tests.console.realtime.agent_link import HELLO

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_hello_advertising_a_path_and_query_is_refused_and_stores_nothing():
    token = (await database_sync_to_async(AgentCredential.issue)("h1"))[1]
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())])
    assert (await comm.connect())[0]
    await comm.send_to(text_data=json.dumps(HELLO | {"endpoint": "http://127.0.0.1:6379/v2/health/live?"}))
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and "endpoint" in reply["reason"] and "scheme://host:port" in reply["reason"]
    assert not await database_sync_to_async(Host.objects.filter(name="h1").exists)()
    await comm.send_to(text_data=json.dumps(HELLO))  # a base URL is taken on the same link
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "desired_state"
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    assert host.endpoint == HELLO["endpoint"]
    await comm.disconnect()
