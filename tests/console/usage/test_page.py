"""The usage page: totals, a chart per team, key and model, and a table by any of them, as the reader's teams may
see; the CSV link downloads the same range."""

from __future__ import annotations

import csv
import io
import re
import time

import pytest

from console.accounts.models import ApiToken
from console.usage.store import write
from tests.console.team_scene import PASSWORD, team_scene

pytestmark = pytest.mark.django_db


@pytest.fixture
def scene(tmp_path):
    teams = team_scene(tmp_path)
    alice, bob = ApiToken.objects.get(user__username="alice"), ApiToken.objects.get(user__username="bob")
    minute = int(time.time()) // 60 * 60
    write({(minute, teams.a.pk, alice.pk, "chat-a"): [3, 1, 30, 12, 0.3],
           (minute - 600, teams.a.pk, alice.pk, "sql-a"): [1, 0, 5, 5, 0.0],
           (minute, teams.b.pk, bob.pk, "chat-b"): [7, 0, 70, 7, 0.0]})
    return teams, alice


def _total(html: str, name: str) -> str:
    return re.search(rf'data-total="{name}">.*?class="stat-value">([^<]*)<', html, re.S).group(1)


def test_a_member_sees_their_teams_usage_with_charts_and_a_table(client, scene):
    teams, alice = scene
    client.login(username="alice", password=PASSWORD)
    html = client.get("/usage/?by=deployment").content.decode()
    assert _total(html, "requests") == "4" and _total(html, "prompt_tokens") == "35"
    assert _total(html, "completion_tokens") == "17"
    assert 'data-key="chat-a"' in html and 'data-key="sql-a"' in html and "chat-b" not in html
    assert html.count('data-chart="usage-') == 3
    assert 'href="/api/v1/usage.csv?group=deployment&amp;since=' in html
    by_key = client.get("/usage/?by=token&range=1h").content.decode()
    assert f'data-key="{alice.prefix}"' in by_key and teams.tokens["alice"] not in by_key


def test_an_admin_sees_every_team_and_the_csv_link_downloads(client, scene):
    teams, _ = scene
    client.login(username="root", password=PASSWORD)
    html = client.get("/usage/").content.decode()
    assert _total(html, "requests") == "11" and 'data-key="team-b"' in html
    csv_url = re.search(r'href="(/api/v1/usage\.csv\?[^"]+)"', html).group(1).replace("&amp;", "&")
    rows = list(csv.DictReader(io.StringIO(client.get(csv_url).content.decode())))
    assert sum(int(r["requests"]) for r in rows) == 11 and {r["team"] for r in rows} == {"team-a", "team-b"}


def test_the_page_needs_a_sign_in(client):
    assert client.get("/usage/").status_code == 302


def test_a_tokens_chart_shows_the_models_that_used_the_most_tokens_not_requests(client, scene):
    teams, alice = scene
    minute = int(time.time()) // 60 * 60
    # Six busy v2 deployments (many requests, no tokens): the chart of tokens still shows the one that used tokens.
    write({(minute, teams.a.pk, alice.pk, f"v2-{i}"): [50, 0, 0, 0, 0.0] for i in range(6)})
    client.login(username="alice", password=PASSWORD)
    html = client.get("/usage/?by=deployment&range=1h").content.decode()
    legend = re.search(r'data-chart="usage-deployment".*?<ul class="chart-legend">(.*?)</ul>', html, re.S).group(1)
    assert "chat-a" in legend and "sql-a" in legend


def test_one_models_usage_is_its_own_page_linked_from_the_table(client, scene):
    client.login(username="alice", password=PASSWORD)
    html = client.get("/usage/?by=deployment&range=1h").content.decode()
    assert 'href="?range=1h&amp;by=token&amp;model=chat-a"' in html
    one = client.get("/usage/?by=deployment&range=1h&model=chat-a").content.decode()
    assert _total(one, "requests") == "3" and _total(one, "prompt_tokens") == "30"
    assert 'data-model="chat-a"' in one and 'data-key="sql-a"' not in one
    assert "deployment=chat-a" in re.search(r'href="(/api/v1/usage.csv[^"]*)"', one).group(1)
    other = client.get("/usage/?range=1h&model=chat-b").content.decode()  # another team's: nothing of it
    assert _total(other, "requests") == "0"
