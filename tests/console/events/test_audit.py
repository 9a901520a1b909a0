"""The audit trail: every change a person makes (REST API with a token, pages in a session, the Django admin) is an
event naming who made it, and GET /api/v1/audit and the /audit/ page list those changes (never the scheduler's or
the agents' events), newest first, scoped to the viewer's teams as the Events page is, filtered by who, by kind and
by time, a page at a time; a bad filter is a 422 naming it (on the page: said, never a 500)."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import RequestFactory
from django.utils import timezone

from console.accounts.models import ApiToken, Team
from console.events.models import Event
from console.events.record import Note, record
from console.fleet.models import Host
from tests.conftest import write_model_dir
from tests.console.team_scene import PASSWORD, calls_as, team_scene
from tests.refusals import refusal

pytestmark = pytest.mark.django_db


@pytest.fixture
def scene(tmp_path):
    scene = team_scene(tmp_path)
    Host.objects.create(name="h1", connected=True)
    Event.objects.all().delete()  # the scene's own making (no actor) is not what these tests read
    return scene


@pytest.fixture
def as_user(client, scene):
    return calls_as(client, scene)


CHANGES = [  # who, method, path, body, the object told of, its reason
    ("alice", "post", "/api/v1/deployments", {"name": "new-a", "model": "tiny-a"}, "deployment/new-a", "Created"),
    ("alice", "patch", "/api/v1/deployments/chat-a", {"max_replicas": 2}, "deployment/chat-a", "PolicyChanged"),
    ("alice", "delete", "/api/v1/deployments/chat-a", None, "deployment/chat-a", "Deleted"),
    ("alice", "patch", "/api/v1/adapters/sql-a", {"pinned": True}, "adapter/sql-a", "Updated"),
    ("alice", "delete", "/api/v1/adapters/sql-a", None, "adapter/sql-a", "Deleted"),
    ("alice", "post", "/api/v1/routes", {"name": "r-a", "branches": [{"deployment": "chat-a"}]}, "route/r-a",
     "Created"),
    ("alice", "post", "/api/v1/tokens", {"name": "ci"}, "token/alice/ci", "TokenCreated"),
    ("root", "post", "/api/v1/teams", {"name": "team-c", "members": ["alice"]}, "team/team-c", "TeamCreated"),
    ("root", "post", "/api/v1/teams/team-a/members", {"user": "bob"}, "team/team-a", "MemberAdded"),
    ("root", "delete", "/api/v1/teams/team-a/members/alice", None, "team/team-a", "MemberRemoved"),
    ("root", "post", "/api/v1/agent-credentials", {"host_name": "h9"}, "host/h9", "TokenCreated"),
    ("root", "patch", "/api/v1/hosts/h1", {"labels": {"zone": "east"}}, "host/h1", "HostPlacementChanged"),
    ("root", "patch", "/api/v1/scheduler", {"strategy": "balance"}, "scheduler", "StrategyChanged"),
    ("root", "patch", "/api/v1/alerts/rules/host_offline", {"window_s": 600}, "alert/host_offline",
     "AlertRuleChanged"),
]


@pytest.mark.parametrize(("user", "method", "path", "body", "obj", "reason"), CHANGES,
                         ids=[f"{c[1]} {c[2]}" for c in CHANGES])
def test_each_change_through_a_token_is_audited_naming_the_token_and_its_user(as_user, user, method, path, body,
                                                                               obj, reason):
    answer = as_user(user, method, path, body)
    assert answer.status_code < 300, answer.content
    (row,) = [r for r in as_user("root", "get", "/api/v1/audit").json() if r["object"] == obj]
    assert row["reason"] == reason and row["actor"] == f"token bot ({user})"


def test_models_and_token_revocations_are_audited_too(as_user, scene, tmp_path):
    registered = as_user("alice", "post", "/api/v1/models", {"name": "tiny-a2",
                                                             "path": str(write_model_dir(tmp_path / "a2"))})
    assert registered.status_code == 201, registered.content
    token = ApiToken.objects.get(user__username="alice", name="bot")
    assert as_user("root", "delete", f"/api/v1/tokens/{token.pk}").status_code == 204
    assert as_user("root", "delete", "/api/v1/agent-credentials/h9").status_code == 404  # none: nothing told
    rows = {(r["object"], r["reason"]): r["actor"] for r in as_user("root", "get", "/api/v1/audit").json()}
    assert rows == {("model/tiny-a2", "Registered"): "token bot (alice)",
                    ("token/alice/bot", "TokenRevoked"): "token bot (root)"}


def test_a_change_on_a_page_names_the_user_and_one_in_the_admin_says_so(client, scene):
    client.login(username="alice", password=PASSWORD)
    assert client.post("/deployments/chat-a/policy/", {"max_replicas": "2", "min_replicas": "1",
                                                       "priority": "standard"}).status_code in (200, 302)
    request = RequestFactory().post("/admin/")
    request.user = get_user_model().objects.get(username="root")
    team = Team.objects.get(name="team-a")
    bob = get_user_model().objects.get(username="bob")
    form = SimpleNamespace(changed_data=["members"], initial={"members": list(team.members.all())},
                           cleaned_data={"members": get_user_model().objects.filter(username__in=["alice", "bob"])})
    team.members.add(bob)
    admin.site._registry[Team].save_model(request, team, form, change=True)
    rows = {r.object: (r.actor, r.message) for r in Event.objects.filter(actor__startswith="user ")}
    assert rows["deployment/chat-a"][0] == "user alice"
    assert rows["team/team-a"] == ("user root (admin)", "members ['alice'] → ['alice', 'bob']")


def test_tokens_hosts_and_agent_tokens_changed_in_the_admin_are_audited(scene):
    from console.fleet.models import AgentCredential

    request = RequestFactory().post("/admin/")
    request.user = get_user_model().objects.get(username="root")
    AgentCredential.issue("h1")
    rows = [(ApiToken.objects.get(user__username="alice"), "name", "bot", "token/alice/bot"),
            (Host.objects.get(name="h1"), "labels", {}, "host/h1"),
            (AgentCredential.objects.get(host_name="h1"), "host_name", "h1", "host/h1")]
    Event.objects.all().delete()
    for row, field, before, _ in rows:
        form = SimpleNamespace(changed_data=[field], initial={field: before}, cleaned_data={field: getattr(row, field)})
        admin.site._registry[type(row)].save_model(request, row, form, change=True)
        admin.site._registry[type(row)].delete_model(request, row)
    told = list(Event.objects.order_by("id").values_list("object", "reason", "actor", "host"))
    assert told == [(obj, reason, "user root (admin)", "h1" if obj == "host/h1" else "")
                    for _, _, _, obj in rows for reason in ("Changed", "Deleted")]


def test_the_schedulers_and_agents_events_are_not_changes_by_people(as_user):
    record([Note("replica/chat-a#0", "Placed", "placed", actor="scheduler", deployment="chat-a"),
            Note("replica/chat-a#0", "Ready", "ready", actor="agent h1", deployment="chat-a"),
            Note("host/h1", "Connected", "connected", actor="console", host="h1"),
            Note("deployment/chat-a", "PolicyChanged", "max 2", actor="token bot (alice)", deployment="chat-a")])
    assert [r["reason"] for r in as_user("root", "get", "/api/v1/audit").json()] == ["PolicyChanged"]


def test_a_member_sees_their_teams_changes_and_an_admin_everyones(as_user):
    for side, user in (("a", "alice"), ("b", "bob")):
        assert as_user(user, "patch", f"/api/v1/deployments/chat-{side}", {"max_replicas": 2}).status_code == 200
        assert as_user(user, "post", "/api/v1/routes", {"name": f"r-{side}", "branches": [
            {"deployment": f"chat-{side}"}]}).status_code == 201
    assert as_user("alice", "delete", "/api/v1/routes/r-a").status_code == 204
    mine = [r["object"] for r in as_user("alice", "get", "/api/v1/audit").json()]
    assert mine == ["route/r-a", "route/r-a", "deployment/chat-a"]  # newest first; the deleted route's too
    everyone = {r["object"] for r in as_user("root", "get", "/api/v1/audit").json()}
    assert everyone == {"route/r-a", "deployment/chat-a", "route/r-b", "deployment/chat-b"}


def test_a_member_sees_the_tokens_of_people_in_their_teams_only(as_user):
    for user in ("alice", "bob"):
        assert as_user(user, "post", "/api/v1/tokens", {"name": "ci/deploy"}).status_code == 201
    seen = {u: [e["object"] for e in as_user(u, "get", "/api/v1/events").json()["events"]]
            for u in ("alice", "root")}
    assert seen["alice"] == ["token/alice/ci/deploy"]
    assert [r["object"] for r in as_user("alice", "get", "/api/v1/audit?kind=token").json()] == [
        "token/alice/ci/deploy"]
    assert set(seen["root"]) == {"token/alice/ci/deploy", "token/bob/ci/deploy"}
    Team.objects.get(name="team-a").members.add(get_user_model().objects.get(username="bob"))  # now a teammate
    assert len(as_user("alice", "get", "/api/v1/audit?kind=token").json()) == 2


def test_filters_by_who_kind_and_time(as_user):
    as_user("alice", "patch", "/api/v1/deployments/chat-a", {"max_replicas": 2})
    as_user("root", "patch", "/api/v1/deployments/chat-b", {"max_replicas": 2})
    as_user("root", "patch", "/api/v1/scheduler", {"strategy": "balance"})
    old = Event.objects.get(object="deployment/chat-a")
    Event.objects.filter(pk=old.pk).update(last_seen=timezone.now() - timedelta(days=2))

    def objects(query: str) -> list[str]:
        answer = as_user("root", "get", f"/api/v1/audit?{query}")
        assert answer.status_code == 200, answer.content
        return [r["object"] for r in answer.json()]

    assert objects("who=alice") == ["deployment/chat-a"]
    assert objects("who=root") == ["scheduler", "deployment/chat-b"]
    assert objects("who=ali") == []  # a user name, not a part of one
    assert objects("kind=deployment") == ["deployment/chat-b", "deployment/chat-a"]
    assert objects("kind=scheduler") == ["scheduler"]
    day_ago = (timezone.now() - timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert objects(f"since={day_ago}") == ["scheduler", "deployment/chat-b"]
    assert objects(f"until={day_ago}") == ["deployment/chat-a"]
    assert objects(f"kind=deployment&who=root&since={day_ago}") == ["deployment/chat-b"]


@pytest.mark.parametrize(("query", "param", "words"), [
    ("kind=deploymint", "kind", "not one of deployment, model"),
    ("who=a%20b", "who", "is not a user name"),
    ("since=yesterday", "since", "neither unix seconds nor an ISO 8601 time"),
    ("until=soon", "until", "neither unix seconds nor an ISO 8601 time"),
    ("since=2026-11-02&until=2026-11-01", "until", "before since"),
    ("per_page=0", "per_page", "greater than or equal to 1"),
])
def test_a_bad_filter_is_a_422_naming_it(as_user, query, param, words):
    answer = as_user("alice", "get", f"/api/v1/audit?{query}")
    assert answer.status_code == 422, answer.content
    assert answer.json()["detail"][0]["loc"] == ["query", param] and words in refusal(answer)


def test_the_audit_comes_a_page_at_a_time(as_user):
    for n in (2, 3, 4):
        as_user("alice", "patch", "/api/v1/deployments/chat-a", {"max_replicas": n})
    first = as_user("alice", "get", "/api/v1/audit?per_page=2")
    second = as_user("alice", "get", "/api/v1/audit?per_page=2&page=2")
    assert first.headers["X-Total-Count"] == "3" and 'rel="next"' in first.headers["Link"]
    assert [r["message"] for r in first.json() + second.json()] == [
        "max replicas 3 → 4", "max replicas 2 → 3", "max replicas 1 → 2"]


def test_the_audit_page_lists_filters_and_says_what_is_wrong(client, as_user):
    as_user("alice", "patch", "/api/v1/deployments/chat-a", {"max_replicas": 2})
    as_user("bob", "patch", "/api/v1/deployments/chat-b", {"max_replicas": 2})
    as_user("alice", "post", "/api/v1/tokens", {"name": "ci"})
    client.login(username="alice", password=PASSWORD)
    page = client.get("/audit/").content.decode()
    assert 'href="/audit/"' in page  # the nav link
    assert 'data-object="deployment/chat-a"' in page and 'data-object="token/alice/ci"' in page
    assert "chat-b" not in page and "token bot (alice)" in page
    only = client.get("/audit/?kind=token").content.decode()
    assert 'data-object="token/alice/ci"' in only and 'data-object="deployment/chat-a"' not in only
    bad = client.get("/audit/?kind=nope")
    assert bad.status_code == 200 and "kind: &#x27;nope&#x27; is not one of" in bad.content.decode()
