"""Alerts open and resolve with the fleet, each change on the timeline, owed to a webhook that is retried with
backoff; the dashboard shows a banner; the rules change through the API, told on the timeline."""

import asyncio
from datetime import timedelta

import pytest
from aiohttp import web
from django.utils import timezone

from console.alerts import webhooks
from console.alerts.evaluate import evaluate
from console.alerts.models import Alert, AlertRule, WebhookDelivery
from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from console.events.models import Event

pytestmark = pytest.mark.django_db


def violating(name: str, minutes: float) -> None:
    create_deployment(name, "tiny", slo_latency_ms=200)
    Deployment.objects.filter(name=name).update(violating=True, observed_p95_ms=450.0,
                                                status_since=timezone.now() - timedelta(minutes=minutes))


def test_an_alert_opens_once_and_resolves_when_the_condition_ends(model):
    violating("chat", 6)
    assert evaluate(timezone.now()) == 1
    assert evaluate(timezone.now()) == 0  # still firing: nothing new
    (alert,) = Alert.objects.filter(resolved_at=None)
    assert (alert.rule.kind, alert.object) == ("slo_violation", "deployment/chat")
    assert "p95 latency 450 ms above its 200 ms target for 6 min" in alert.message
    Deployment.objects.filter(name="chat").update(violating=False, status_since=timezone.now())
    assert evaluate(timezone.now()) == 1
    assert not Alert.objects.filter(resolved_at=None).exists()
    told = list(Event.objects.filter(object="deployment/chat", reason__startswith="Alert")
                .order_by("id").values_list("reason", "type"))
    assert told == [("AlertFiring", "Warning"), ("AlertResolved", "Normal")]


def test_a_disabled_rule_resolves_its_open_alerts(model):
    violating("chat", 6)
    evaluate(timezone.now())
    AlertRule.objects.filter(kind="slo_violation").update(enabled=False)
    evaluate(timezone.now())
    assert not Alert.objects.filter(resolved_at=None).exists()


def test_the_dashboard_shows_a_banner_while_alerts_fire(user_client, model):
    assert 'role="alert" aria-label="Alerts firing"' not in user_client.get("/").content.decode()
    violating("chat", 6)
    evaluate(timezone.now())
    page = user_client.get("/").content.decode()
    assert "1 alert firing" in page and 'data-alert="slo_violation" data-object="deployment/chat"' in page
    assert 'data-object="deployment/chat"' in user_client.get("/alerts/banner/").content.decode()


@pytest.fixture
def receiver():
    """A webhook receiver on loopback that answers each POST with the next status of `answers`."""
    got, answers = [], []

    async def hook(request):
        got.append(await request.json())
        return web.Response(status=answers.pop(0) if answers else 200)

    async def start():
        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    return got, answers, start


async def _rounds(start, n: int, later: timedelta = timedelta(0)):
    runner, port = await start()
    try:
        from channels.db import database_sync_to_async

        await database_sync_to_async(AlertRule.in_force)()
        await database_sync_to_async(AlertRule.objects.filter(kind="slo_violation").update)(
            webhook_url=f"http://127.0.0.1:{port}/hook")
        await database_sync_to_async(evaluate)(timezone.now())
        for _ in range(n):
            await webhooks.deliver()
            # The retry is due later: bring it forward rather than wait for its backoff.
            await database_sync_to_async(WebhookDelivery.objects.filter(delivered_at=None).update)(
                next_attempt_at=timezone.now() - later)
    finally:
        await runner.cleanup()


@pytest.mark.django_db(transaction=True)  # the deliveries run on a database thread of their own
def test_a_webhook_is_retried_with_backoff_until_delivered(model, receiver, settings):
    settings.MODELGRID_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]  # the receiver is on loopback
    got, answers, start = receiver
    violating("chat", 6)
    answers += [500, 503]
    asyncio.run(_rounds(start, 3))
    (d,) = WebhookDelivery.objects.all()
    assert d.delivered_at is not None and d.attempts == 3 and d.last_error == "HTTP 503 Service Unavailable"
    assert [g["status"] for g in got] == ["firing"] * 3 and got[0]["object"] == "deployment/chat"
    (delivered,) = Event.objects.filter(reason="WebhookDelivered")
    assert "delivered to http://127.0.0.1:" in delivered.message and "(attempt 3)" in delivered.message


def test_a_failed_attempt_waits_longer_each_time(model):
    violating("chat", 6)
    evaluate(timezone.now())
    alert = Alert.objects.get()
    d = WebhookDelivery.objects.create(alert=alert, url="http://127.0.0.1:9/hook", payload={"status": "firing"},
                                       next_attempt_at=timezone.now())
    waits = []
    for _ in range(3):
        now = timezone.now()
        webhooks.settle([(d, "ConnectionRefusedError")], now)
        waits.append((d.next_attempt_at - now).total_seconds())
    assert waits == [5.0, 10.0, 20.0]


def test_a_webhook_is_given_up_after_its_attempts_and_that_is_told(model):
    violating("chat", 6)
    evaluate(timezone.now())
    d = WebhookDelivery.objects.create(alert=Alert.objects.get(), url="http://127.0.0.1:9/hook",
                                       payload={"status": "firing", "alert": "slo_violation"},
                                       next_attempt_at=timezone.now(), attempts=webhooks.MAX_ATTEMPTS - 1)
    webhooks.settle([(d, "ConnectionRefusedError: refused")], timezone.now())
    d.refresh_from_db()
    assert d.given_up_at is not None
    (failed,) = Event.objects.filter(reason="WebhookFailed")
    assert failed.type == "Warning" and "after 8 attempts: ConnectionRefusedError: refused" in failed.message


def test_rules_change_through_the_api_and_the_change_is_told(admin_api, db):
    r = admin_api.patch("/api/v1/alerts/rules/host_offline", {"window_s": 120, "webhook_url": "https://ops.example/h"})
    assert r.status_code == 200 and r.json()["window_s"] == 120
    (e,) = Event.objects.filter(reason="AlertRuleChanged")
    assert e.object == "alert/host_offline" and "window_s 60 → 120" in e.message and e.actor == "token cli (root-ops)"
    assert admin_api.patch("/api/v1/alerts/rules/nope", {"enabled": False}).status_code == 404
    # A control character (a NUL was a 500 on PostgreSQL, which refuses one in a query) is no URL either.
    for url in ("ftp://x", "http://ops.example/\x00h", "http://ops.example/\x07h"):
        bad = admin_api.patch("/api/v1/alerts/rules/host_offline", {"webhook_url": url})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "webhook_url", url
    assert AlertRule.objects.get(kind="host_offline").webhook_url == "https://ops.example/h"
    assert {r["kind"] for r in admin_api.get("/api/v1/alerts/rules").json()} == {
        "slo_violation", "replica_failing", "host_offline", "foreign_memory_growing"}


def test_only_admins_change_alert_rules_and_a_refusal_changes_nothing(api, admin_api):
    admin_api.patch("/api/v1/alerts/rules/host_offline", {"window_s": 120})
    r = api.patch("/api/v1/alerts/rules/host_offline", {"window_s": 30})
    assert r.status_code == 403 and "only staff users may change alert rules" in r.json()["detail"][0]["msg"]
    assert AlertRule.objects.get(kind="host_offline").window_s == 120


def test_a_replica_failing_repeatedly_and_a_silent_host_fire(host):
    from console.events.record import Note, record

    failed = Note("replica/chat#0", "OutOfMemory", "CUDA out of memory", warning=True, deployment="chat")
    record([failed, failed, Note("replica/chat#0", "Failed", "exit code 1", warning=True, deployment="chat")])
    host.connected, host.unknown_since = False, timezone.now() - timedelta(minutes=5)
    host.save()
    evaluate(timezone.now())
    fired = dict(Alert.objects.filter(resolved_at=None).values_list("object", "rule__kind"))
    assert fired == {"replica/chat#0": "replica_failing", "host/h1": "host_offline"}


def test_foreign_memory_growing_on_a_host_fires_from_its_recorded_series(host, settings):
    from console.fleet.models import Gpu
    from console.series.sampler import sample

    GiB = 1 << 30
    t0 = timezone.now() - timedelta(minutes=5)
    for minute, used in ((0, GiB), (2, GiB), (4, 3 * GiB)):  # another process takes 2 GiB more
        Gpu.objects.filter(host=host, index=0).update(used_bytes=used, own_bytes=0)
        sample(t0 + timedelta(minutes=minute))
    evaluate(timezone.now())
    (alert,) = Alert.objects.filter(resolved_at=None)
    assert (alert.rule.kind, alert.object) == ("foreign_memory_growing", "host/h1")
    assert alert.message.startswith("memory used by processes ModelGrid does not own grew by 2.00 GiB in 10 min")


def test_hosts_without_foreign_memory_are_not_read(host, django_assert_max_num_queries):
    from console.alerts.evaluate import firing

    rule = next(r for r in AlertRule.in_force() if r.kind == "foreign_memory_growing")
    with django_assert_max_num_queries(1):
        assert firing(rule, timezone.now()) == {}
