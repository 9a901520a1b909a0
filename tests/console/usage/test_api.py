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
    theirs = _get(client, teams.tokens["alice"], f"/api/v1/usage?team=team-b&{RANGE}")
    assert theirs.status_code == 422 and "no team named 'team-b'" in str(theirs.json())
    own = _get(client, teams.tokens["alice"], f"/api/v1/usage?team=team-a&{RANGE}").json()
    assert [(g["key"], g["totals"]["requests"]) for g in own["groups"]] == [("team-a", 5)]


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


@pytest.mark.parametrize(("query", "field"), [("until=1e12", "until"), ("until=-1e12", "until"),
                                               ("until=253402300800", "until"), ("since=-1e12", "since"),
                                               (f"since=-1e12&until={T0}", "since"),
                                               ("since=1e12&until=1e12", "until"),
                                               ("until=0001-01-01T00:00:00", "until")])
def test_a_time_beyond_1970_to_9999_is_a_422_naming_it(client, scene, query, field):
    teams, _ = scene
    for url in ("/api/v1/usage", "/api/v1/usage.csv"):
        response = _get(client, teams.tokens["alice"], f"{url}?{query}")
        assert response.status_code == 422, (url, response.content)
        detail = response.json()["detail"]
        assert [item["loc"] for item in detail] == [["query", field]], detail
        assert "9999" in detail[0]["msg"], detail


def test_the_last_day_of_9999_is_readable(client, scene):
    teams, _ = scene
    last = 253402300799
    for url in ("/api/v1/usage", "/api/v1/usage.csv"):
        response = _get(client, teams.tokens["alice"], f"{url}?until={last}")
        assert response.status_code == 200, (url, response.content)


def test_a_future_since_without_until_blames_since_not_until(client, scene):
    teams, _ = scene
    for url in ("/api/v1/usage", "/api/v1/usage.csv"):
        response = _get(client, teams.tokens["alice"], f"{url}?since=4000000000")
        assert response.status_code == 422, response.content
        detail = response.json()["detail"]
        assert [item["loc"] for item in detail] == [["query", "since"]], detail
        assert "future" in detail[0]["msg"] and "until" not in detail[0]["loc"], detail


@pytest.mark.parametrize("name", ["typo", "team-b", "Not A Name!"])
def test_a_team_that_is_missing_or_not_yours_is_a_422_naming_it(client, scene, name):
    teams, _ = scene
    for url in ("/api/v1/usage", "/api/v1/usage.csv"):
        response = _get(client, teams.tokens["alice"], f"{url}?team={name}&{RANGE}")
        assert response.status_code == 422, response.content
        detail = response.json()["detail"]
        assert [item["loc"] for item in detail] == [["query", "team"]], detail
        assert f"no team named {name!r}" in detail[0]["msg"], detail


def test_an_admin_may_read_any_teams_usage(client, scene):
    teams, _ = scene
    got = _get(client, teams.tokens["root"], f"/api/v1/usage?team=team-b&{RANGE}").json()
    assert [(g["key"], g["totals"]["requests"]) for g in got["groups"]] == [("team-b", 7)]
