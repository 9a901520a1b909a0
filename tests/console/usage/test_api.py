"""GET /api/v1/usage and /api/v1/usage.csv: totals and series per team, token or deployment, a member seeing only
their teams' usage (admins all), and 422s that name the bad parameter."""

from __future__ import annotations

import csv
import io

import pytest

from console.accounts.models import ApiToken
from console.usage.store import write
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db
T0 = 1_800_000_000 - 1_800_000_000 % 3600
RANGE = f"since={T0}&until={T0 + 3600}"


@pytest.fixture
def scene(tmp_path):
    teams = team_scene(tmp_path)
    alice = ApiToken.objects.get(user__username="alice")
    bob = ApiToken.objects.get(user__username="bob")
    write({(T0, teams.a.pk, alice.pk, "chat-a"): [3, 1, 30, 12, 0.5],
           (T0 + 600, teams.a.pk, alice.pk, "chat-a"): [2, 0, 20, 8, 0.0],
           (T0 + 60, teams.b.pk, bob.pk, "chat-b"): [7, 0, 70, 7, 0.0]})
    return teams, alice


def _get(client, token, url):
    return client.get(url, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_member_sees_their_teams_usage_only(client, scene):
    teams, _ = scene
    mine = _get(client, teams.tokens["alice"], f"/api/v1/usage?group=deployment&{RANGE}&step=300").json()
    assert [g["key"] for g in mine["groups"]] == ["chat-a"]
    assert mine["totals"] == {"requests": 5, "errors": 1, "prompt_tokens": 50, "completion_tokens": 20,
                              "queue_seconds": 0.5}
    series = mine["groups"][0]["series"]
    assert len(series) == 12 and series[0]["at"] == T0 and series[0]["requests"] == 3 and series[2]["requests"] == 2
    theirs = _get(client, teams.tokens["alice"], f"/api/v1/usage?team=team-b&{RANGE}").json()
    assert theirs["groups"] == [] and theirs["totals"]["requests"] == 0


def test_an_admin_sees_every_team_and_tokens_are_named_never_shown(client, scene):
    teams, alice = scene
    by_team = _get(client, teams.tokens["root"], f"/api/v1/usage?{RANGE}").json()
    assert [(g["key"], g["totals"]["requests"]) for g in by_team["groups"]] == [("team-b", 7), ("team-a", 5)]
    by_token = _get(client, teams.tokens["root"], f"/api/v1/usage?group=token&{RANGE}").json()
    labels = {g["key"]: g["label"] for g in by_token["groups"]}
    assert labels[alice.prefix] == f"alice / bot ({alice.prefix}…)"
    assert teams.tokens["alice"] not in str(by_token)


def test_the_csv_has_a_row_per_step_and_group_with_requests(client, scene):
    teams, alice = scene
    response = _get(client, teams.tokens["alice"], f"/api/v1/usage.csv?group=token&{RANGE}&step=300")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["token"], r["requests"], r["prompt_tokens"]) for r in rows] == [(alice.prefix, "3", "30"),
                                                                              (alice.prefix, "2", "20")]
    assert rows[0]["period_start"].endswith("Z") and rows[0]["period_seconds"] == "300"


@pytest.mark.parametrize(("query", "field"), [("group=user", "group"), (f"{RANGE}&step=90", "step"),
                                               (f"{RANGE}&step=30", "step"), ("since=yesterday", "since"),
                                               (f"since={T0}&until=soon", "until"),
                                               (f"since={T0}&until={T0}", "until"),
                                               (f"since={T0 - 86400 * 30}&until={T0}&step=60", "step")])
def test_a_bad_parameter_is_a_422_naming_it(client, scene, query, field):
    teams, _ = scene
    for url in ("/api/v1/usage", "/api/v1/usage.csv"):
        response = _get(client, teams.tokens["alice"], f"{url}?{query}")
        assert response.status_code == 422, response.content
        assert field in [loc for item in response.json()["detail"] for loc in item["loc"]], response.json()
