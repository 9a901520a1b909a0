"""Teams: who acts within which (members, admins across all), the team a new object goes to, and the REST API that
manages them (admins), every change on the timeline with its actor."""

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from console.accounts.models import DEFAULT_TEAM, ApiToken, Team
from console.accounts.teams import creation_team, teams_of
from console.catalog.services import register_model
from console.errors import Forbidden, Invalid
from console.events.models import Event
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(db):
    users = get_user_model().objects
    return users.create_user("alice"), users.create_user("root", is_staff=True), users.create_superuser("su")


def _api(client, user):
    """A REST client with a new token ("bot") of `user`."""
    token = ApiToken.issue(user, "bot")[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    class Api:
        def get(self, url):
            return client.get(url, **auth)

        def post(self, url, body):
            return client.post(url, data=json.dumps(body), content_type="application/json", **auth)

        def patch(self, url, body):
            return client.patch(url, data=json.dumps(body), content_type="application/json", **auth)

        def delete(self, url):
            return client.delete(url, **auth)

    return Api()


def test_a_new_user_joins_the_default_team_so_a_one_team_install_is_unchanged(people, model_dir):
    alice, _, _ = people
    default = Team.objects.get(name=DEFAULT_TEAM)
    assert teams_of(alice) == frozenset({default.pk})
    assert register_model("tiny", str(model_dir)).team == default


def test_admins_and_superusers_act_across_teams(people):
    _, root, su = people
    assert teams_of(root) is None and teams_of(su) is None


def test_a_token_made_by_createapitoken_acts_in_the_default_team(db):
    call_command("createapitoken", "robot", stdout=StringIO(), stderr=StringIO())
    robot = get_user_model().objects.get(username="robot")
    assert list(robot.teams.values_list("name", flat=True)) == [DEFAULT_TEAM]


def test_a_new_object_goes_to_the_creators_only_team_or_the_one_named(people):
    alice, root, _ = people
    other = Team.objects.create(name="other")
    assert creation_team(alice).name == DEFAULT_TEAM
    other.members.add(alice)
    with pytest.raises(Invalid, match="alice is in several teams \\(default, other\\); say which one owns it"):
        creation_team(alice)
    assert creation_team(alice, "other") == other
    assert creation_team(root, "other") == other  # admins: any team
    assert creation_team(root).name == DEFAULT_TEAM


def test_a_team_one_is_not_in_is_refused_and_no_team_at_all_too(people):
    alice, _, _ = people
    Team.objects.create(name="other")
    with pytest.raises(Invalid, match="not a member of a team named 'other'") as e:
        creation_team(alice, "other")
    assert e.value.fields == ["team"]
    alice.teams.clear()
    with pytest.raises(Forbidden, match="alice is in no team"):
        creation_team(alice)


def test_an_admin_creates_a_team_with_members_on_the_timeline(client, people):
    _, root, _ = people
    r = _api(client, root).post("/api/v1/teams", {"name": "ml", "members": ["alice"]})
    assert r.status_code == 201, r.content
    assert r.json()["name"] == "ml" and r.json()["members"] == ["alice"]
    event = Event.objects.get(object="team/ml")
    assert (event.reason, event.actor) == ("TeamCreated", "token bot (root)")
    assert "with alice" in event.message


def test_a_team_name_taken_or_a_user_unknown_is_refused(client, people):
    _, root, _ = people
    api = _api(client, root)
    taken = api.post("/api/v1/teams", {"name": DEFAULT_TEAM})
    unknown = api.post("/api/v1/teams", {"name": "ml", "members": ["nobody"]})
    assert taken.status_code == 409 and refused_fields(taken) == ["name"]
    assert unknown.status_code == 422 and refusal(unknown) == "members: no user named 'nobody'"
    assert not Team.objects.filter(name="ml").exists()


def test_an_admin_adds_and_removes_members(client, people):
    alice, root, _ = people
    Team.objects.create(name="ml")
    api = _api(client, root)
    added = api.post("/api/v1/teams/ml/members", {"user": "alice"})
    assert added.status_code == 200 and added.json()["members"] == ["alice"]
    removed = api.delete("/api/v1/teams/ml/members/alice")
    assert removed.status_code == 200 and removed.json()["members"] == []
    again = api.delete("/api/v1/teams/ml/members/alice")
    assert again.status_code == 404 and refusal(again) == "'alice' is not a member of team ml"
    reasons = list(Event.objects.filter(object="team/ml").order_by("pk").values_list("reason", "actor"))
    assert reasons == [("MemberAdded", "token bot (root)"), ("MemberRemoved", "token bot (root)")]


def test_only_admins_manage_teams(client, people):
    alice, _, _ = people
    api = _api(client, alice)
    created = api.post("/api/v1/teams", {"name": "mine"})
    joined = api.post(f"/api/v1/teams/{DEFAULT_TEAM}/members", {"user": "su"})
    assert created.status_code == joined.status_code == 403
    assert "only admins (staff users) may create teams" in refusal(created)


def test_a_user_lists_their_own_teams_and_an_admin_every_team(client, people):
    alice, root, _ = people
    Team.objects.create(name="ml")
    assert [t["name"] for t in _api(client, alice).get("/api/v1/teams").json()] == [DEFAULT_TEAM]
    assert [t["name"] for t in _api(client, root).get("/api/v1/teams").json()] == [DEFAULT_TEAM, "ml"]
    assert _api(client, alice).get("/api/v1/teams/ml").status_code == 404
