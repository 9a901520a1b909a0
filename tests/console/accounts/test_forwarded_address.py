"""A sign-in is counted under the address that connected, as the server in front of Django (uvicorn) passes it:
a client's own X-Forwarded-For is believed only from a proxy the operator named in FORWARDED_ALLOW_IPS, so a
locked-out user cannot sign in again by sending one."""

import re
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import httpx
import pytest
import uvicorn
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import RequestFactory

from tests.console.accounts.conftest import PASSWORD

# Requests go through the whole ASGI stack, which opens and closes its own connections (the pool, on PostgreSQL).
pytestmark = pytest.mark.django_db(transaction=True)


def served(forwarded_allow_ips: str | None = None):
    """The console's ASGI app wrapped as `manage.py up` serves it (console.connections.server_options): uvicorn's
    proxy handling, its trusted proxies from the settings unless given here."""
    from console.asgi import application
    from console.connections import server_options

    options = server_options()
    if forwarded_allow_ips is not None:
        options |= {"proxy_headers": True, "forwarded_allow_ips": forwarded_allow_ips}
    config = uvicorn.Config(application, lifespan="off", log_config=None, **options)
    config.load()
    return config.loaded_app


def sign_in(app, password: str, forwarded_for: str | None = None, peer: str = "127.0.0.1") -> int:
    """One sign-in through `app` from `peer`, with a CSRF token as a browser has it; returns the status."""

    async def go() -> int:
        transport = httpx.ASGITransport(app=app, client=(peer, 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            page = await client.get("/accounts/login/")
            token = SimpleCookie(page.headers["set-cookie"])["csrftoken"].value
            headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": f"csrftoken={token}"}
            if forwarded_for:
                headers["X-Forwarded-For"] = forwarded_for
            body = urlencode({"username": "ann", "password": password, "csrfmiddlewaretoken": token})
            response = await client.post("/accounts/login/", content=body, headers=headers)
            return response.status_code

    return async_to_sync(go)()


def lock_out(app, **where) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT):
        assert sign_in(app, "wrong-password", **where) in (200, 429)


def test_a_locked_out_user_cannot_sign_in_again_by_sending_x_forwarded_for(ann):
    app = served()
    lock_out(app)
    assert sign_in(app, PASSWORD) == 429
    assert sign_in(app, PASSWORD, forwarded_for="203.0.113.7") == 429
    assert sign_in(app, PASSWORD, forwarded_for="203.0.113.8, 198.51.100.1") == 429


def test_no_proxy_is_trusted_unless_the_operator_names_one():
    from console.connections import server_options

    assert settings.FORWARDED_ALLOW_IPS == ""
    assert server_options()["proxy_headers"] is False


def test_behind_a_named_proxy_each_forwarded_client_is_counted_apart(ann):
    app = served(forwarded_allow_ips="127.0.0.1")
    lock_out(app, forwarded_for="203.0.113.7")
    assert sign_in(app, PASSWORD, forwarded_for="203.0.113.7") == 429
    assert sign_in(app, PASSWORD, forwarded_for="203.0.113.8") == 302


def test_the_address_counted_is_remote_addr_never_a_header():
    from console.accounts.throttle import client_address

    request = RequestFactory().post("/accounts/login/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="10.9.9.9",
                                    HTTP_X_REAL_IP="10.8.8.8", HTTP_FORWARDED="for=10.7.7.7")
    assert client_address(request) == "10.0.0.1"
    assert re.fullmatch(r"[\w.]+\.client_address", settings.AXES_CLIENT_IP_CALLABLE)
