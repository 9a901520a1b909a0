"""The Routes pages: a member lists their teams' routes, creates one from the form (name, branches with weights, a
fallback), changes and deletes it, through the same services as the REST API (on the timeline with who). A refused
form says the service's reason beside the input it is about, a branch's beside its row, and stores nothing; another
team's routes and deployments are nowhere on the pages, and its route's pages are 404."""

import pytest
from django.contrib.auth import get_user_model

from console.accounts.models import Team
from console.catalog.adapters import register_adapter
from console.deployments.services import create_deployment
from console.events.models import Event
from console.routes.models import Route
from console.routes.services import create_route
from tests.adapter_files import write_adapter
from tests.console.team_scene import UP, team_scene

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def scene(tmp_path, settings):
    """The team scene with a second deployment of each team (chat-a2, chat-b2) and team b's route `route-b`."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # the scene's users, at once
    scene = team_scene(tmp_path)
    for side in "ab":
        create_deployment(f"chat-{side}2", f"tiny-{side}")
    create_route("route-b", [{"deployment": "chat-b", "weight": 3}, {"deployment": "chat-b2"}])
    return scene


def as_user(client, name: str):
    client.force_login(get_user_model().objects.get(username=name))
    return client


def canary(**changes) -> dict:
    form = {"name": "assistant", "target": ["chat-a", "chat-a2"], "weight": ["95", "5"], "fallback": ""}
    return form | changes


def beside(html: str, name: str, nth: int = 0) -> str:
    """What the page says with input `name` (its `nth`), up to the end of its label or table cell."""
    after = html.split(f'name="{name}"')[nth + 1]
    return after.split("</label>", 1)[0].split("</td>", 1)[0]


def test_the_page_needs_a_login_and_is_in_the_navigation(client, scene):
    assert client.get("/routes/")["Location"].startswith("/accounts/login/")
    html = as_user(client, "alice").get("/").content.decode()
    assert '<a href="/routes/"' in html and ">Routes</a>" in html


def test_a_member_sees_only_their_teams_routes_and_deployments(client, scene):
    create_route("route-a", [{"deployment": "chat-a", "weight": 9}, {"deployment": "chat-a2"}], fallback=None)
    html = as_user(client, "alice").get("/routes/").content.decode()
    assert 'data-route="route-a"' in html and "90% <a" in html and "10% <a" in html
    assert "route-b" not in html and "chat-b" not in html and "sql-b" not in html
    assert '<option value="chat-a2">' in html and '<option value="chat-a/sql-a">' in html  # its adapter, as a branch


def test_a_route_is_created_from_the_form_and_the_timeline_names_who(client, scene):
    r = as_user(client, "alice").post("/routes/", canary(fallback="chat-a2"), follow=True)
    assert r.status_code == 200
    route = Route.objects.get(name="assistant")
    assert route.team.name == "team-a" and route.fallback.name == "chat-a2"
    assert [(b.deployment.name, b.weight) for b in route.branches.all()] == [("chat-a", 95), ("chat-a2", 5)]
    html = r.content.decode()
    assert "Route assistant created: routes to chat-a 95%, chat-a2 5%; fallback chat-a2" in html
    assert 'data-route="assistant"' in html
    event = Event.objects.get(object="route/assistant")
    assert event.reason == "Created" and event.actor == "user alice"


def test_empty_rows_are_left_out_and_a_branch_may_name_an_adapter(client, scene):
    form = canary(target=["", "chat-a/sql-a", ""], weight=["1", "4", "1"])
    as_user(client, "alice").post("/routes/", form)
    (branch,) = Route.objects.get(name="assistant").branches.all()
    assert (branch.deployment.name, branch.adapter.name, branch.weight) == ("chat-a", "sql-a", 4)


def test_a_refused_branch_says_the_services_reason_beside_its_row_and_nothing_is_stored(client, scene, tmp_path):
    register_adapter("sql-a2", "chat-a2", str(write_adapter(tmp_path / "sql-a2", {UP: (8, 16, 32)})))
    form = canary(target=["", "chat-a", "chat-a2/sql-a"], weight=["1", "1", "1"])  # sql-a is chat-a's adapter
    r = as_user(client, "alice").post("/routes/", form)
    html = r.content.decode()
    assert r.status_code == 422
    row = beside(html, "target", 2)
    assert "adapter &#x27;sql-a&#x27; belongs to deployment &#x27;chat-a&#x27;, not &#x27;chat-a2&#x27;" in row
    assert 'class="field-error"' not in beside(html, "target", 1)
    assert '<option value="chat-a/sql-a">' in html  # what was chosen is kept
    assert not Route.objects.filter(name="assistant").exists()


def test_another_teams_deployment_is_refused_as_one_nobody_has(client, scene):
    r = as_user(client, "alice").post("/routes/", canary(target=["chat-a", "chat-b"]))
    assert r.status_code == 422
    assert "branch 1: there is no deployment named &#x27;chat-b&#x27;" in beside(r.content.decode(), "target", 1)
    assert not Route.objects.filter(name="assistant").exists()


def test_a_weight_out_of_range_is_refused_beside_its_row(client, scene):
    r = as_user(client, "alice").post("/routes/", canary(weight=["95", "0"]))
    assert r.status_code == 422
    assert "greater than or equal to 1" in beside(r.content.decode(), "target", 1)
    r = client.post("/routes/", canary(weight=["lots", "5"]))
    assert "branch 0: weight must be a whole number" in beside(r.content.decode(), "target", 0)
    assert not Route.objects.exists() or list(Route.objects.values_list("name", flat=True)) == ["route-b"]


def test_a_taken_name_and_a_bad_fallback_are_refused_beside_their_fields(client, scene):
    r = as_user(client, "alice").post("/routes/", canary(name="chat-a"))
    assert r.status_code == 409 and "a deployment is already named" in beside(r.content.decode(), "name")
    r = client.post("/routes/", canary(name="route-b"))  # another team's name: still one namespace
    assert r.status_code == 409 and "already exists" in beside(r.content.decode(), "name")
    r = client.post("/routes/", canary(target=["chat-a", ""], fallback="chat-a"))
    assert r.status_code == 422 and "a fallback must be another deployment" in beside(r.content.decode(), "fallback")
    assert list(Route.objects.values_list("name", flat=True)) == ["route-b"]


def test_a_member_of_several_teams_names_the_routes_team(client, scene):
    Team.objects.get(name="team-b").members.add(get_user_model().objects.get(username="alice"))
    r = as_user(client, "alice").post("/routes/", canary(team="team-b"))
    assert r.status_code == 422
    assert "is team team-a&#x27;s, and the route is team team-b&#x27;s" in beside(r.content.decode(), "target", 0)
    r = client.post("/routes/", canary(name="b-canary", team="team-b", target=["chat-b", "chat-b2"]))
    assert r.status_code == 302 and Route.objects.get(name="b-canary").team.name == "team-b"


def test_htmx_swaps_the_refused_card_and_sends_the_browser_on_when_created(client, scene):
    r = as_user(client, "alice").post("/routes/", canary(target=["chat-a", "chat-a"]), **HTMX)
    html = r.content.decode()
    assert r.status_code == 200 and html.startswith('<section class="card route-form"')
    assert "named twice" in beside(html, "target", 1)
    r = client.post("/routes/", canary(), **HTMX)
    assert r.status_code == 200 and r["HX-Redirect"] == "/routes/"  # a new anchor alone would not load it


def test_a_route_is_changed_from_its_page(client, scene):
    create_route("route-a", [{"deployment": "chat-a"}])
    page = as_user(client, "alice").get("/routes/route-a/edit/").content.decode()
    assert "<h1>route-a" in page and "route-b" not in page and "chat-b" not in page
    r = client.post("/routes/route-a/edit/", {"target": ["chat-a", "chat-a2"], "weight": ["1", "3"],
                                              "fallback": ""}, follow=True)
    assert "Route route-a changed: routes to chat-a 25%, chat-a2 75%; no fallback" in r.content.decode()
    assert [b.weight for b in Route.objects.get(name="route-a").branches.all()] == [1, 3]
    r = client.post("/routes/route-a/edit/", {"target": ["chat-a2"], "weight": ["1"], "fallback": "chat-a2"})
    assert r.status_code == 422 and "a fallback must be another deployment" in beside(r.content.decode(), "fallback")
    assert Route.objects.get(name="route-a").fallback is None
    assert list(Event.objects.filter(object="route/route-a").values_list("reason", "actor").order_by("id")) == [
        ("Created", ""), ("Changed", "user alice")]


def test_a_route_is_deleted_from_the_page(client, scene):
    create_route("route-a", [{"deployment": "chat-a"}])
    r = as_user(client, "alice").post("/routes/route-a/delete/", follow=True)
    assert "Route route-a deleted" in r.content.decode() and not Route.objects.filter(name="route-a").exists()


def test_another_teams_route_pages_are_404_and_change_nothing(client, scene):
    alice = as_user(client, "alice")
    assert alice.get("/routes/route-b/edit/").status_code == 404
    assert alice.post("/routes/route-b/edit/", {"target": ["chat-b"], "weight": ["1"]}).status_code == 404
    assert alice.post("/routes/route-b/delete/").status_code == 404
    assert Route.objects.get(name="route-b").branches.count() == 2


def test_an_admin_sees_every_teams_routes_with_their_team(client, scene):
    html = as_user(client, "root").get("/routes/").content.decode()
    assert 'data-route="route-b"' in html and "<td>team-b</td>" in html
    assert '<optgroup label="team team-a">' in html and '<optgroup label="team team-b">' in html


def test_another_branch_row_comes_as_a_fragment_of_the_viewers_targets(client, scene):
    html = as_user(client, "alice").get("/routes/branch/", **HTMX).content.decode()
    assert html.strip().startswith("<tr") and '<option value="chat-a2">' in html and "chat-b" not in html
