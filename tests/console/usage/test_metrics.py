"""Usage on /metrics: counters per team, token and deployment read from the buckets, so every console process
scrapes the same figures, and they keep growing when minutes are rolled into hours and old hours are pruned."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from console.accounts.models import ApiToken
from console.gateway.metrics import ConsoleMetrics
from console.usage.store import keep, write
from tests.console.gateway.test_fleet_metrics import at, samples
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db
T0 = 1_800_000_000 - 1_800_000_000 % 3600


def _scrape() -> dict:
    from console.gateway.fleet_metrics import scrape

    return samples(scrape(ConsoleMetrics()).decode())


def test_usage_counters_are_the_buckets_totals_and_survive_rolling(tmp_path, settings):
    teams = team_scene(tmp_path)
    alice = ApiToken.objects.get(user__username="alice")
    label = {"team": "team-a", "token": f"alice / bot ({alice.prefix}…)", "deployment": "chat-a"}
    write({(T0, teams.a.pk, alice.pk, "chat-a"): [3, 1, 30, 12, 0.5],
           (T0 + 60, teams.a.pk, alice.pk, "chat-a"): [2, 0, 20, 8, 0.25]})
    first = _scrape()
    assert at(first, "modelgrid_usage_requests_total", **label) == 5
    assert at(first, "modelgrid_usage_errors_total", **label) == 1
    assert at(first, "modelgrid_usage_prompt_tokens_total", **label) == 50
    assert at(first, "modelgrid_usage_completion_tokens_total", **label) == 20
    assert at(first, "modelgrid_usage_queue_seconds_total", **label) == 0.75
    assert teams.tokens["alice"] not in str(first)
    settings.MODELGRID_USAGE_MINUTE_RETENTION_DAYS = 1
    keep(datetime.fromtimestamp(T0 + 3 * 86400, UTC))  # both minutes rolled into their hour
    write({(T0 + 3 * 86400, teams.a.pk, alice.pk, "chat-a"): [1, 0, 1, 1, 0.0]})
    after = _scrape()
    assert at(after, "modelgrid_usage_requests_total", **label) == 6
    assert at(after, "modelgrid_usage_prompt_tokens_total", **label) == 51
    settings.MODELGRID_USAGE_HOUR_RETENTION_DAYS = 1
    keep(datetime.fromtimestamp(T0 + 3 * 86400, UTC))  # the hour of the first two minutes is pruned
    assert at(_scrape(), "modelgrid_usage_requests_total", **label) == 6  # a counter never goes back


@pytest.mark.django_db(transaction=True)
async def test_a_members_scrape_has_their_teams_deployments_only_and_no_usage_per_token(tmp_path):
    import httpx
    from asgiref.sync import sync_to_async

    from console.gateway.app import make_app
    from console.gateway.core import Gateway, GatewaySettings

    teams = await sync_to_async(team_scene)(tmp_path)
    bob = await sync_to_async(ApiToken.objects.get)(user__username="bob")
    await sync_to_async(write)({(T0, teams.b.pk, bob.pk, "chat-b"): [1, 0, 3, 2, 0.0]})
    gateway = Gateway(GatewaySettings(), ConsoleMetrics())
    for name in ("chat-a", "chat-b"):
        gateway.metrics.requests.labels(name, "", "200").inc()
    pages = {}
    for user in ("alice", "root"):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(make_app(gateway)), base_url="http://gw",
                                     headers={"Authorization": f"Bearer {teams.tokens[user]}"}, timeout=10) as c:
            pages[user] = (await c.get("/metrics")).text
    await gateway.close()
    assert "modelgrid_usage_requests_total" not in pages["alice"] and "bob / bot" not in pages["alice"]
    assert 'modelgrid_usage_requests_total{deployment="chat-b",team="team-b"' in pages["root"]
    assert 'deployment="chat-a"' in pages["alice"] and "chat-b" not in pages["alice"]
    assert 'modelgrid_gateway_requests_total{adapter="",code="200",deployment="chat-b"} 1.0' in pages["root"]
    assert "modelgrid_hosts" in pages["alice"]  # the fleet's own series stay: hosts are shared
