import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from console.asgi import application
from console.fleet.models import Gpu, Host
from console.realtime.notify import refresh_dashboards

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")  # the browser's own origin: the Origin must equal it exactly


def session_cookie() -> bytes:
    get_user_model().objects.create_user("ann", password="a-long-password")
    client = Client()
    assert client.login(username="ann", password="a-long-password")
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def test_it_refuses_an_anonymous_browser():
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[ORIGIN])
    connected, _ = await comm.connect()
    assert not connected


async def test_it_refuses_another_origin():
    cookie = await database_sync_to_async(session_cookie)()
    comm = WebsocketCommunicator(application, "/ws/dashboard/",
                                 headers=[(b"origin", b"http://evil.example"), (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert not connected


async def test_it_pushes_the_grid_now_and_again_when_the_fleet_changes():
    cookie = await database_sync_to_async(session_cookie)()
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[HOST, ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert connected
    first = await comm.receive_from(timeout=5)
    assert 'id="fleet-grid"' in first and "No hosts yet" in first

    def add_host():
        h = Host.objects.create(name="gpu-box", connected=True)
        Gpu.objects.create(host=h, index=0, uuid="SIM", name="Simulated GPU", total_bytes=1 << 34, simulated=True)

    await database_sync_to_async(add_host)()
    await refresh_dashboards()
    second = await comm.receive_from(timeout=5)
    assert "gpu-box" in second and "simulated" in second
    await comm.disconnect()
