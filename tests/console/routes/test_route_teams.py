"""A route belongs to a team, as a deployment does: the REST API lists, reads, changes and deletes only the token's
teams' routes (another team's answers 404 as a name nobody has, and nothing changes), a route's branches and
fallback are deployments of its own team (422 naming the branch), and the deployment page shows only the viewer's
teams' routes."""

import re

import pytest

from console.accounts.models import DEFAULT_TEAM, Team
from console.deployments.services import create_deployment
from console.events.models import Event
from console.routes.models import Branch, Route
from console.routes.services import create_route
from tests.console.team_scene import PASSWORD, calls_as, team_scene
from tests.refusals import refusal

pytestmark = pytest.mark.django_db


@pytest.fixture
def scene(tmp_path):
    """The team scene, with a second deployment of each team (chat-a2, chat-b2) and a route of each team."""
    scene = team_scene(tmp_path)
    for side in "ab":
        create_deployment(f"chat-{side}2", f"tiny-{side}")
        create_route(f"route-{side}", [{"deployment": f"chat-{side}", "weight": 9}, {"deployment": f"chat-{side}2"}])
    return scene


@pytest.fixture
def as_user(client, scene):
    return calls_as(client, scene)


def test_a_route_goes_to_its_branches_team_and_says_so(scene):
    assert Route.objects.get(name="route-a").team == scene.a
    assert Route.objects.get(name="route-b").team == scene.b


def test_a_list_shows_only_the_tokens_teams_routes_and_an_admin_every_teams(as_user):
    assert [(r["name"], r["team"]) for r in as_user("alice", "get", "/api/v1/routes").json()] == [
        ("route-a", "team-a")]
    assert [(r["name"], r["team"]) for r in as_user("root", "get", "/api/v1/routes").json()] == [
        ("route-a", "team-a"), ("route-b", "team-b")]


def test_another_teams_route_reads_changes_and_deletes_as_a_name_nobody_has(as_user):
    nobody = as_user("alice", "get", "/api/v1/routes/nobody")
    answers = [as_user("alice", "get", "/api/v1/routes/route-b"),
               as_user("alice", "patch", "/api/v1/routes/route-b", {"branches": [{"deployment": "chat-b"}]}),
               as_user("alice", "delete", "/api/v1/routes/route-b")]
    for answer in answers:
        assert answer.status_code == 404
        assert refusal(answer) == refusal(nobody).replace("nobody", "route-b")
    assert Branch.objects.filter(route__name="route-b").count() == 2
    assert not Event.objects.filter(object="route/route-b").exclude(reason="Created").exists()
    assert as_user("bob", "get", "/api/v1/routes/route-b").status_code == 200


def test_a_member_changes_and_deletes_their_teams_route(as_user):
    changed = as_user("alice", "patch", "/api/v1/routes/route-a", {"branches": [{"deployment": "chat-a2"}]})
    assert changed.status_code == 200, changed.content
    assert [b["deployment"] for b in changed.json()["branches"]] == ["chat-a2"]
    assert as_user("alice", "delete", "/api/v1/routes/route-a").status_code == 204
    assert not Route.objects.filter(name="route-a").exists()


def test_another_teams_deployment_is_no_branch_a_member_can_name(as_user):
    r = as_user("alice", "post", "/api/v1/routes", {"name": "mixed", "branches": [
        {"deployment": "chat-a"}, {"deployment": "chat-b"}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "branches", 1, "deployment"]
    assert "no deployment named 'chat-b'" in refusal(r)
    assert not Route.objects.filter(name="mixed").exists()


def test_an_admin_cannot_mix_teams_in_one_route_either(as_user):
    r = as_user("root", "post", "/api/v1/routes", {"name": "mixed", "branches": [
        {"deployment": "chat-a"}, {"deployment": "chat-b"}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "branches", 1, "deployment"]
    assert "'chat-b' is team team-b's, and the route is team team-a's" in refusal(r)
    fallback = as_user("root", "post", "/api/v1/routes", {"name": "mixed", "branches": [{"deployment": "chat-a"}],
                                                          "fallback": "chat-b"})
    assert fallback.status_code == 422 and fallback.json()["detail"][0]["loc"] == ["body", "fallback"]
    assert not Route.objects.filter(name="mixed").exists()


def test_a_changed_route_keeps_its_branches_in_its_team(as_user):
    r = as_user("root", "patch", "/api/v1/routes/route-a", {"branches": [{"deployment": "chat-b"}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "branches", 0, "deployment"]
    assert "the route is team team-a's" in refusal(r)
    assert Branch.objects.filter(route__name="route-a").count() == 2


def test_the_team_in_the_body_is_where_it_goes_and_must_be_the_requesters(as_user, scene):
    r = as_user("root", "post", "/api/v1/routes", {"name": "alias", "team": "team-b",
                                                   "branches": [{"deployment": "chat-b2"}]})
    assert r.status_code == 201 and r.json()["team"] == "team-b"
    wrong = as_user("root", "post", "/api/v1/routes", {"name": "alias-2", "team": "team-a",
                                                       "branches": [{"deployment": "chat-b2"}]})
    assert wrong.status_code == 422 and "the route is team team-a's" in refusal(wrong)
    theirs = as_user("alice", "post", "/api/v1/routes", {"name": "alias-3", "team": "team-b",
                                                         "branches": [{"deployment": "chat-a"}]})
    assert theirs.status_code == 422 and theirs.json()["detail"][0]["loc"][-1] == "team"
    assert not Route.objects.filter(name__in=["alias-2", "alias-3"]).exists()


def test_a_route_made_before_teams_is_the_default_teams():
    """As the migration leaves existing routes (routes 0002: the field's default, the default team)."""
    route = Route.objects.create(name="old")
    assert route.team.name == DEFAULT_TEAM == Team.objects.get(pk=route.team_id).name


def test_the_deployment_page_shows_only_the_viewers_teams_routes(client, scene):
    # Another team's route over this deployment, as an upgrade could leave one (made before routes had teams).
    stray = Route.objects.create(name="stray", team=scene.b)
    Branch.objects.create(route=stray, position=0, deployment_id=scene.a.deployments.get(name="chat-a").pk)
    client.login(username="alice", password=PASSWORD)
    html = client.get("/deployments/chat-a/").content.decode()
    section = re.search(r'<section class="card" id="routes">.*?</section>', html, re.S).group(0)
    assert 'data-route="route-a"' in section and "stray" not in section
