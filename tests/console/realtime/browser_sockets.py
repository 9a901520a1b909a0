"""Browser sockets as the dashboard tests open them: a user's session cookie, and a socket of it past its first
page (or its close)."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from console.asgi import application

ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")  # the browser's own origin: the Origin must equal it exactly


def _cookie(username: str) -> bytes:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        user = get_user_model().objects.create_user(username, password="a-long-password")
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def cookie_of(username: str) -> bytes:
    """A new signed-in session of `username` (made if there is no such user), as a Cookie header's value."""
    return await database_sync_to_async(_cookie)(username)


async def opened(cookie: bytes, query: str = "") -> WebsocketCommunicator:
    """A dashboard socket with `cookie`, accepted (its first message not read)."""
    comm = WebsocketCommunicator(application, "/ws/dashboard/" + (f"?{query}" if query else ""),
                                 headers=[HOST, ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect(timeout=10)
    assert connected
    return comm
