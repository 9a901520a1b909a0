"""Fixtures shared by the serving tests."""

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.serving import make_app
from agent.serving.auth import GatewayAuth
from tests.agent.serving.fake_app import AUTH, SECRET, FakeSource


@pytest.fixture
async def serve():
    """A client of the app over fake replicas that sends the gateway secret (`secret=None`: the app holds
    none; `headers`: what the client sends instead)."""
    clients = []

    async def start(*replicas, batching=None, source=None, secret=SECRET, headers=AUTH, picker=None):
        auth = GatewayAuth(secret) if secret is not None else None
        app = make_app(source or FakeSource(*replicas), batching=batching, auth=auth, picker=picker)
        client = TestClient(TestServer(app), headers=headers)
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()
