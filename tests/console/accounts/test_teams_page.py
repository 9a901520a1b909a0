"""The Teams page: a member sees their own teams read-only (members, deployments, limits, quota used and when it
resets); an admin sees every team and changes its limits, quota, period, ceiling and members, and makes teams,
through the REST API's services (on the timeline with who). A refused form says why beside the field and changes
nothing."""

import time

import pytest

from console.accounts import counters
from console.accounts.models import LimitCounter, Team
from console.events.models import Event
from tests.console.team_scene import PASSWORD, team_scene

pytestmark = pytest.mark.django_db


@pytest.fixture
def scene(tmp_path):
    return team_scene(tmp_path)


def beside(html: str, name: str, team: str = "") -> str:
    """The label of input `name` (in team `team`'s card): the field and what is said beside it."""
    if team:
        html = html.split(f'data-team="{team}"', 1)[1]
    return html.split(f'name="{name}"', 1)[1].split("</label>", 1)[0]


def signed_in(client, user: str):
    client.login(username=user, password=PASSWORD)
    return client


def test_the_page_needs_a_login_and_is_in_the_navigation(client, scene):
    assert client.get("/teams/")["Location"].startswith("/accounts/login/")
    html = signed_in(client, "alice").get("/").content.decode()
    assert '<a href="/teams/"' in html and ">Teams</a>" in html


def test_a_member_sees_only_their_teams_read_only(client, scene):
    Team.objects.filter(name="team-a").update(rpm_limit=600, token_quota=1000, quota_period="day")
    start, _ = counters.period_bounds("day", time.time())
    LimitCounter.objects.create(key=counters.quota_key(scene.a.pk, "day"), start=start, until=start + 86400,
                                tokens=250)
    r = signed_in(client, "alice").get("/teams/")
    html = r.content.decode()
    assert r.status_code == 200
    assert 'data-team="team-a"' in html and 'data-team="team-b"' not in html
    assert 'data-member="alice"' in html and "1 deployment" in html
    assert '<div class="stat-value" data-limit="rpm_limit">600</div>' in html
    assert "250 used this day (25%)" in html and 'style="width: 25%"' in html
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(start + 86400))
    assert f"resets {tomorrow} 00:00 UTC" in html
    assert 'data-form="limits"' not in html and "Create a team" not in html


def test_an_admin_sees_every_team_with_its_forms(client, scene):
    html = signed_in(client, "root").get("/teams/").content.decode()
    assert 'data-team="team-a"' in html and 'data-team="team-b"' in html
    assert html.count('data-form="limits"') == Team.objects.count() and "Create a team" in html


def test_an_admin_changes_a_teams_limits_and_the_timeline_names_them(client, scene):
    form = {"rpm_limit": "600", "tpm_limit": "", "token_quota": "10000000", "quota_period": "week",
            "priority_ceiling": "critical"}
    r = signed_in(client, "root").post("/teams/team-a/limits/", form, follow=True)
    assert "Saved team team-a&#x27;s limits" in r.content.decode()
    team = Team.objects.get(name="team-a")
    assert (team.rpm_limit, team.tpm_limit, team.token_quota, team.quota_period, team.priority_ceiling) == (
        600, None, 10_000_000, "week", "critical")
    event = Event.objects.filter(object="team/team-a", reason="TeamLimitsChanged").get()
    assert "rpm_limit none → 600" in event.message and "root" in event.actor


def test_a_bad_value_comes_back_beside_its_field_and_changes_nothing(client, scene):
    form = {"rpm_limit": "600", "tpm_limit": "0", "token_quota": "", "quota_period": "month",
            "priority_ceiling": "high"}
    r = signed_in(client, "root").post("/teams/team-a/limits/", form)
    html = r.content.decode()
    assert r.status_code == 422
    field = beside(html, "tpm_limit", "team-a")
    assert "tpm_limit must be a whole number from 1 to" in field and "got 0" in field
    assert 'value="600"' in html.split('data-team="team-a"', 1)[1]  # what was typed stays
    assert Team.objects.get(name="team-a").rpm_limit is None
    assert not Event.objects.filter(reason="TeamLimitsChanged").exists()

    r = client.post("/teams/team-a/limits/", form | {"tpm_limit": "lots"})
    assert r.status_code == 422 and "tpm_limit must be a whole number, got &#x27;lots&#x27;" in r.content.decode()
    r = client.post("/teams/team-a/limits/", form | {"tpm_limit": "", "quota_period": "year"})
    field = beside(r.content.decode(), "quota_period", "team-a")
    assert r.status_code == 422 and "quota_period must be one of day, week, month" in field
    assert Team.objects.get(name="team-a").rpm_limit is None


def test_a_member_cannot_change_a_team(client, scene):
    signed_in(client, "alice")
    r = client.post("/teams/team-a/limits/", {"rpm_limit": "1"})
    assert r.status_code == 403 and "only admins (staff users) may change" in r.content.decode()
    assert client.post("/teams/team-b/limits/", {"rpm_limit": "1"}).status_code == 403
    assert client.post("/teams/team-a/members/", {"user": "bob"}).status_code == 403
    assert client.post("/teams/team-a/members/alice/remove/").status_code == 403
    assert client.post("/teams/new/", {"name": "mine", "members": "alice"}).status_code == 403
    assert Team.objects.filter(rpm_limit__isnull=False).count() == 0 and not Team.objects.filter(name="mine")
    assert list(Team.objects.get(name="team-a").members.values_list("username", flat=True)) == ["alice"]


def test_an_admin_makes_a_team_and_moves_members(client, scene):
    signed_in(client, "root")
    r = client.post("/teams/new/", {"name": "search", "members": "alice, bob"}, follow=True)
    assert "Team search created" in r.content.decode()
    assert sorted(Team.objects.get(name="search").members.values_list("username", flat=True)) == ["alice", "bob"]
    client.post("/teams/search/members/bob/remove/")
    client.post("/teams/team-a/members/", {"user": "bob"})
    assert list(Team.objects.get(name="search").members.values_list("username", flat=True)) == ["alice"]
    assert Team.objects.get(name="team-a").members.filter(username="bob").exists()

    r = client.post("/teams/new/", {"name": "search", "members": ""})
    assert r.status_code == 409 and "a team named &#x27;search&#x27; already exists" in r.content.decode()
    r = client.post("/teams/new/", {"name": "ops", "members": "alice, nobody"})
    field = beside(r.content.decode(), "members")
    assert r.status_code == 422 and "no user named &#x27;nobody&#x27;" in field and not Team.objects.filter(name="ops")
    r = client.post("/teams/team-a/members/", {"user": "nobody"})
    assert r.status_code == 422 and "no user named &#x27;nobody&#x27;" in r.content.decode()


def test_a_quota_of_zero_reads_as_all_used_not_an_error(client, scene):
    Team.objects.filter(name="team-a").update(token_quota=0, quota_period="day")
    r = signed_in(client, "alice").get("/teams/")
    html = r.content.decode()
    assert r.status_code == 200
    assert '<div class="stat-value" data-limit="token_quota">0</div>' in html
    assert "0 used this day (100%)" in html and 'style="width: 100%"' in html
    assert signed_in(client, "root").get("/teams/").status_code == 200
