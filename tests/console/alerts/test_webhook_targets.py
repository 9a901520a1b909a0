"""A webhook reaches public addresses only: a loopback, link-local, private or unspecified target is refused when a
rule is saved (422, saying why) and again when a delivery is sent, on the address actually connected to, so a name
that resolves elsewhere at send time (DNS rebinding) reaches nothing. An operator may allow named hosts."""

import asyncio
import socket

import pytest
from aiohttp import web
from channels.db import database_sync_to_async
from django.utils import timezone

from console.alerts import webhooks
from console.alerts.evaluate import evaluate
from console.alerts.models import AlertRule, WebhookDelivery
from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from console.events.models import Event

PUBLIC = "93.184.216.34"  # what the names below resolve to when a rule is saved (no lookup leaves this machine)

REFUSED = {
    "a loopback address": ("http://127.0.0.1:6379/", "loopback"),
    "a name for loopback": ("http://localhost:8000/hook", "loopback"),
    "loopback written as one number": ("http://2130706433:6379/", "loopback"),
    "the cloud metadata service": ("http://169.254.169.254/latest/meta-data/", "link-local"),
    "a private address": ("https://10.1.2.3/hook", "private"),
    "the unspecified address": ("http://0.0.0.0:8000/", "unspecified"),
    "IPv6 loopback": ("http://[::1]:8000/", "loopback"),
    "loopback mapped into IPv6": ("http://[::ffff:127.0.0.1]:8000/", "loopback"),
}


@pytest.mark.parametrize(("url", "word"), REFUSED.values(), ids=REFUSED.keys())
def test_a_rule_whose_webhook_targets_an_internal_address_is_refused_and_unchanged(admin_api, db, url, word):
    r = admin_api.patch("/api/v1/alerts/rules/host_offline", {"webhook_url": url})
    assert r.status_code == 422
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "webhook_url"] and word in item["msg"]
    assert "MODELGRID_WEBHOOK_ALLOWED_HOSTS" in item["msg"]
    assert not AlertRule.objects.exclude(webhook_url="").exists()
    assert not Event.objects.filter(reason="AlertRuleChanged").exists()


def test_a_webhook_that_is_no_url_is_refused_in_words(admin_api, db):
    # Schemathesis found it: an unbalanced "[" made the URL parser raise, and the API answer 500.
    r = admin_api.patch("/api/v1/alerts/rules/host_offline", {"webhook_url": "http://0D[\u00b4k"})
    assert r.status_code == 422 and "is not a URL" in r.json()["detail"][0]["msg"]


def test_a_public_target_and_an_allowed_host_are_taken(admin_api, db, settings):
    public = admin_api.patch("/api/v1/alerts/rules/host_offline", {"webhook_url": f"https://{PUBLIC}/h"})
    assert public.status_code == 200
    settings.MODELGRID_WEBHOOK_ALLOWED_HOSTS = ["alertmanager.internal", "127.0.0.1"]
    for url in ("http://127.0.0.1:9093/api/v2/alerts", "http://ALERTMANAGER.internal:9093/hook"):
        assert admin_api.patch("/api/v1/alerts/rules/host_offline", {"webhook_url": url}).status_code == 200, url


def test_the_admin_form_refuses_an_internal_target_too(db):
    from django.core.exceptions import ValidationError

    rule = AlertRule(kind="host_offline", window_s=60, webhook_url="http://127.0.0.1:6379/")
    with pytest.raises(ValidationError) as refused:
        rule.full_clean()
    assert "loopback" in str(refused.value.message_dict["webhook_url"])


@pytest.fixture
def receiver():
    """A webhook receiver on loopback; `got` lists what reached it."""
    got = []

    async def hook(request):
        got.append(await request.json())
        if request.path == "/moved":
            raise web.HTTPTemporaryRedirect("/hook")
        return web.Response(status=200)

    async def start():
        app = web.Application()
        app.router.add_post("/hook", hook)
        app.router.add_post("/moved", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    return got, start


async def _deliver_to(start, url_of) -> None:
    runner, port = await start()
    try:
        def owe() -> None:
            create_deployment("chat", "tiny", slo_latency_ms=200)
            Deployment.objects.filter(name="chat").update(violating=True, observed_p95_ms=450.0,
                                                          status_since=timezone.now() - timezone.timedelta(minutes=6))
            AlertRule.in_force()
            # Stored as an older console or the database itself could have it: the send-time check stands alone.
            AlertRule.objects.filter(kind="slo_violation").update(webhook_url=url_of(port))
            evaluate(timezone.now())

        await database_sync_to_async(owe)()
        await webhooks.deliver()
    finally:
        await runner.cleanup()


@pytest.mark.django_db(transaction=True)
def test_a_delivery_to_a_loopback_service_is_not_sent_and_says_why(model, receiver):
    got, start = receiver
    asyncio.run(_deliver_to(start, lambda port: f"http://127.0.0.1:{port}/hook"))
    assert got == []
    (d,) = WebhookDelivery.objects.all()
    assert d.delivered_at is None and "127.0.0.1 is a loopback address" in d.last_error


@pytest.mark.django_db(transaction=True)
def test_a_name_that_resolves_to_loopback_only_when_sent_reaches_nothing(model, receiver, monkeypatch):
    got, start = receiver
    real = socket.getaddrinfo

    def rebinding(host, *args, **kwargs):
        # Public when the rule was saved, loopback by the time the delivery is sent.
        return real("127.0.0.1" if host == "hooks.example" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    asyncio.run(_deliver_to(start, lambda port: f"http://hooks.example:{port}/hook"))
    assert got == []
    (d,) = WebhookDelivery.objects.all()
    assert "hooks.example resolves to 127.0.0.1, a loopback address" in d.last_error


@pytest.mark.django_db(transaction=True)
def test_an_allowed_host_is_delivered_to_but_a_redirect_is_not_followed(model, receiver, settings):
    settings.MODELGRID_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    got, start = receiver
    asyncio.run(_deliver_to(start, lambda port: f"http://127.0.0.1:{port}/moved"))
    assert len(got) == 1  # the redirect's target was not POSTed to
    (d,) = WebhookDelivery.objects.all()
    assert d.delivered_at is None and "HTTP 307" in d.last_error and "not followed" in d.last_error
