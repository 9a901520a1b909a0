"""The dashboard websocket takes only browsers on the console's own origin (scheme, host and port exactly, like
Django's CSRF check) or an origin listed in CSRF_TRUSTED_ORIGINS. The agent websocket has no origin check."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from console.asgi import application
from console.fleet.models import AgentCredential

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie() -> bytes:
    user, _ = get_user_model().objects.get_or_create(username="ann")
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connects(host: bytes, origin: bytes | None, path: str = "/ws/dashboard/", secure: bool = False) -> bool:
    cookie = await database_sync_to_async(session_cookie)()
    headers = [(b"host", host), (b"cookie", cookie)] + ([(b"origin", origin)] if origin else [])
    comm = WebsocketCommunicator(application, path, headers=headers)
    if secure:
        comm.scope["scheme"] = "wss"
    connected, _ = await comm.connect()
    if connected:  # past its first page: the render that read the database is over before the test's flush
        await comm.receive_from(timeout=10)
    await comm.disconnect()
    return connected


async def test_the_same_origin_is_accepted():
    assert await connects(b"127.0.0.1:8000", b"http://127.0.0.1:8000")


async def test_another_port_on_the_same_host_is_refused():
    assert not await connects(b"127.0.0.1:8000", b"http://127.0.0.1:9999")
    assert not await connects(b"127.0.0.1:8000", b"http://127.0.0.1")


async def test_another_scheme_is_refused():
    assert not await connects(b"127.0.0.1:8000", b"https://127.0.0.1:8000")
    assert await connects(b"127.0.0.1:8000", b"https://127.0.0.1:8000", secure=True)


async def test_another_allowed_host_is_refused():
    assert not await connects(b"127.0.0.1:8000", b"http://localhost:8000")


async def test_a_handshake_without_an_origin_is_refused():
    assert not await connects(b"127.0.0.1:8000", None)


async def test_a_host_outside_allowed_hosts_is_refused_even_when_the_origin_matches():
    assert not await connects(b"evil.example:8000", b"http://evil.example:8000")


async def test_an_origin_in_csrf_trusted_origins_is_accepted(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com", "https://*.grid.example.com"]
    assert await connects(b"127.0.0.1:8000", b"https://console.example.com")
    assert await connects(b"127.0.0.1:8000", b"https://eu.grid.example.com")
    assert not await connects(b"127.0.0.1:8000", b"https://console.example.com:8443")
    assert not await connects(b"127.0.0.1:8000", b"http://console.example.com")


async def test_the_proxy_ssl_header_makes_the_origin_https(settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    cookie = await database_sync_to_async(session_cookie)()
    headers = [(b"host", b"console.test"), (b"origin", b"https://console.test"), (b"cookie", cookie),
               (b"x-forwarded-proto", b"https")]
    settings.ALLOWED_HOSTS = ["console.test"]
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
    connected, _ = await comm.connect()
    await comm.disconnect()
    assert connected


async def test_the_agent_websocket_has_no_origin_check():
    token = (await database_sync_to_async(AgentCredential.issue)("h1"))[1]
    for origin in (None, b"http://evil.example"):
        headers = [(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {token}".encode())]
        headers += [(b"origin", origin)] if origin else []
        comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        connected, _ = await comm.connect()
        assert connected
        await comm.disconnect()
