import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from console.asgi import application
from console.control.hub import refresh_dashboards
from console.fleet.models import Gpu, Host

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


async def test_it_pushes_the_page_its_browser_is_viewing():
    """The page's websocket URL carries its query string: each push is that page of that search, not page 1."""
    cookie = await database_sync_to_async(session_cookie)()

    def add_hosts(names):
        for name in names:
            Host.objects.create(name=name, connected=name.startswith("east"))

    await database_sync_to_async(add_hosts)(["east-1", "east-2", "west-1"])
    comm = WebsocketCommunicator(application, "/ws/dashboard/?q=east&state=connected&dq=nothing",
                                 headers=[HOST, ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert connected
    first = await comm.receive_from(timeout=5)
    assert 'data-host="east-1"' in first and 'data-host="east-2"' in first and 'data-host="west-1"' not in first
    assert 'id="fleet-summary"' in first and "<b>2</b> connected" in first  # the summary is the whole fleet's

    await database_sync_to_async(add_hosts)(["east-3", "west-2"])
    await refresh_dashboards()
    second = await comm.receive_from(timeout=5)
    assert 'data-host="east-3"' in second and 'data-host="west-2"' not in second
    assert "<strong>1–3</strong> of 3 hosts" in second
    await comm.disconnect()


async def test_an_odd_query_string_shows_the_first_page_with_a_note():
    cookie = await database_sync_to_async(session_cookie)()
    comm = WebsocketCommunicator(application, "/ws/dashboard/?page=%00x&state=%00",
                                 headers=[HOST, ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert connected
    html = await comm.receive_from(timeout=5)
    assert "page “?x” is not a page number; showing page 1" in html and "No hosts yet" in html
    assert "state “?” is not a host state" in html and "\x00" not in html
    await comm.disconnect()
