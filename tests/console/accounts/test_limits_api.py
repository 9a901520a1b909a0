"""Setting limits through the REST API: a team's requests and tokens per minute, quota and period, and priority
ceiling (admins only; GET shows them and the quota used this period), a token's own per-minute limits (at creation
and by PATCH, its owner or staff). Every change is on the timeline with who made it; a refusal names the field and
changes nothing."""

import time

import pytest
from django.contrib.auth import get_user_model

from console.accounts.counters import period_bounds, quota_key
from console.accounts.models import DEFAULT_TEAM, ApiToken, LimitCounter, Team
from console.events.models import Event
from tests.console.accounts.test_teams import _api
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(db):
    users = get_user_model().objects
    return users.create_user("alice"), users.create_user("root", is_staff=True)


def _team_fields(name: str = "ml") -> dict:
    return Team.objects.filter(name=name).values("rpm_limit", "tpm_limit", "token_quota", "quota_period",
                                                 "priority_ceiling").get()


def test_a_new_team_has_no_limits_and_a_high_ceiling_and_the_default_team_none(client, people):
    _, root = people
    api = _api(client, root)
    made = api.post("/api/v1/teams", {"name": "ml"}).json()
    default = api.get(f"/api/v1/teams/{DEFAULT_TEAM}").json()
    assert {k: made[k] for k in ("rpm_limit", "tpm_limit", "token_quota", "quota_period", "quota_used",
                                 "priority_ceiling")} == {"rpm_limit": None, "tpm_limit": None, "token_quota": None,
                                                          "quota_period": "month", "quota_used": 0,
                                                          "priority_ceiling": "high"}
    assert default["priority_ceiling"] == "critical"


def test_an_admin_sets_a_teams_limits_and_the_timeline_says_who(client, people):
    _, root = people
    Team.objects.create(name="ml")
    api = _api(client, root)
    r = api.patch("/api/v1/teams/ml", {"rpm_limit": 600, "tpm_limit": 50000, "token_quota": 10_000_000,
                                       "quota_period": "week", "priority_ceiling": "critical"})
    assert r.status_code == 200, r.content
    assert _team_fields() == {"rpm_limit": 600, "tpm_limit": 50000, "token_quota": 10_000_000, "quota_period": "week",
                              "priority_ceiling": "critical"}
    event = Event.objects.get(object="team/ml", reason="TeamLimitsChanged")
    assert event.actor == "token bot (root)"
    assert "rpm_limit none → 600" in event.message and "priority_ceiling high → critical" in event.message
    cleared = api.patch("/api/v1/teams/ml", {"rpm_limit": None})
    assert cleared.status_code == 200 and cleared.json()["rpm_limit"] is None
    assert cleared.json()["tpm_limit"] == 50000  # fields left out stay


def test_get_shows_the_tokens_used_this_quota_period(client, people):
    alice, _ = people
    team = Team.objects.get(name=DEFAULT_TEAM)
    Team.objects.filter(pk=team.pk).update(token_quota=1000, quota_period="day")
    start, end = period_bounds("day", time.time())
    LimitCounter.objects.create(key=quota_key(team.pk, "day"), start=start, until=end, requests=0, tokens=420)
    LimitCounter.objects.create(key=quota_key(team.pk, "day"), start=start - 86400, until=start, tokens=999)
    shown = _api(client, alice).get(f"/api/v1/teams/{DEFAULT_TEAM}").json()
    assert (shown["token_quota"], shown["quota_used"]) == (1000, 420)
    assert shown["quota_resets"].startswith(time.strftime("%Y-%m-%dT00:00:00", time.gmtime(end)))


def test_only_admins_change_a_teams_limits(client, people):
    alice, _ = people
    before = _team_fields(DEFAULT_TEAM)
    r = _api(client, alice).patch(f"/api/v1/teams/{DEFAULT_TEAM}", {"rpm_limit": 1_000_000})
    assert r.status_code == 403 and "only admins" in refusal(r)
    assert _team_fields(DEFAULT_TEAM) == before
    assert not Event.objects.filter(reason="TeamLimitsChanged").exists()


@pytest.mark.parametrize("body, field, message", [
    ({"rpm_limit": 0}, "rpm_limit", "rpm_limit must be a whole number from 1"),
    ({"tpm_limit": -5}, "tpm_limit", "tpm_limit must be a whole number from 1"),
    ({"token_quota": 0}, "token_quota", "token_quota must be a whole number from 1"),
    ({"quota_period": "year"}, "quota_period", "quota_period must be one of day, week, month"),
    ({"priority_ceiling": "urgent"}, "priority_ceiling", "priority_ceiling must be one of critical, high"),
    ({"rpm_limit": "10"}, "rpm_limit", ""),
    ({"burst": 3}, "burst", ""),
])
def test_a_bad_limit_is_refused_naming_the_field_and_changes_nothing(client, people, body, field, message):
    _, root = people
    Team.objects.create(name="ml")
    before = _team_fields()
    r = _api(client, root).patch("/api/v1/teams/ml", {"tpm_limit": 100} | body)
    assert r.status_code == 422, r.content
    assert field in refused_fields(r) and message in refusal(r)
    assert _team_fields() == before


def test_a_token_is_made_with_limits_and_its_owner_changes_them(client, people):
    alice, root = people
    api = _api(client, alice)
    made = api.post("/api/v1/tokens", {"name": "etl", "rpm_limit": 60})
    assert made.status_code == 201, made.content
    assert (made.json()["rpm_limit"], made.json()["tpm_limit"]) == (60, None)
    token_id = made.json()["id"]
    assert "60 requests per minute" in Event.objects.get(reason="TokenCreated", object="token/alice/etl").message
    changed = api.patch(f"/api/v1/tokens/{token_id}", {"tpm_limit": 20000, "rpm_limit": None})
    assert changed.status_code == 200, changed.content
    assert ApiToken.objects.filter(pk=token_id).values_list("rpm_limit", "tpm_limit").get() == (None, 20000)
    event = Event.objects.get(reason="TokenLimitsChanged")
    assert event.actor == "token bot (alice)" and "tpm_limit none → 20000" in event.message
    bad = api.patch(f"/api/v1/tokens/{token_id}", {"tpm_limit": 0})
    assert bad.status_code == 422 and refused_fields(bad) == ["tpm_limit"]
    theirs = _api(client, get_user_model().objects.create_user("bob")).patch(f"/api/v1/tokens/{token_id}",
                                                                              {"tpm_limit": 1})
    assert theirs.status_code == 404
    assert ApiToken.objects.filter(pk=token_id).values_list("rpm_limit", "tpm_limit").get() == (None, 20000)
    assert _api(client, root).patch(f"/api/v1/tokens/{token_id}", {"rpm_limit": 5}).status_code == 200


def test_a_token_with_a_bad_limit_is_not_made(client, people):
    alice, _ = people
    r = _api(client, alice).post("/api/v1/tokens", {"name": "etl", "rpm_limit": 0})
    assert r.status_code == 422 and refused_fields(r) == ["rpm_limit"]
    assert not ApiToken.objects.filter(name="etl").exists()
