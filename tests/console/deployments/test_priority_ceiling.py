"""A team's priority ceiling: creating or changing a deployment (REST API, bulk, the policy form) to a priority above
its team's ceiling is refused with 422 naming the priority, the ceiling and who can raise it, and nothing is stored.
It binds admins too; they raise the ceiling first."""

import pytest
from django.contrib.auth import get_user_model

from console.accounts.models import DEFAULT_TEAM, Team
from console.catalog.services import register_model
from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from tests.console.accounts.test_teams import _api
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def ml(db, model_dir):
    """Team ml (a new team: ceiling high) with member alice and model tiny; root is an admin."""
    users = get_user_model().objects
    alice, root = users.create_user("alice", password="a-long-password"), users.create_user("root", is_staff=True)
    alice.teams.clear()
    team = Team.objects.create(name="ml")
    team.members.add(alice)
    register_model("tiny", str(model_dir), team=team)
    return alice, root


def test_a_deployment_above_its_teams_ceiling_is_refused_for_members_and_admins_alike(client, ml):
    alice, root = ml
    for user in (alice, root):
        r = _api(client, user).post("/api/v1/deployments", {"name": "chat", "model": "tiny", "priority": "critical"})
        assert r.status_code == 422 and refused_fields(r) == ["priority"]
        assert refusal(r).startswith("priority critical is above team ml's priority ceiling (high); an admin can "
                                     "raise it (PATCH /api/v1/teams/ml with priority_ceiling)")
    assert not Deployment.objects.exists()
    high = _api(client, alice).post("/api/v1/deployments", {"name": "chat", "model": "tiny", "priority": "high"})
    assert high.status_code == 201, high.content


def test_once_an_admin_raises_the_ceiling_critical_is_allowed(client, ml):
    alice, root = ml
    assert _api(client, root).patch("/api/v1/teams/ml", {"priority_ceiling": "critical"}).status_code == 200
    r = _api(client, alice).post("/api/v1/deployments", {"name": "chat", "model": "tiny", "priority": "critical"})
    assert r.status_code == 201, r.content


def test_changing_a_deployments_priority_above_the_ceiling_is_refused_and_stores_nothing(client, ml):
    alice, _ = ml
    create_deployment("chat", "tiny", priority="standard")
    before = Deployment.objects.values().get(name="chat")
    r = _api(client, alice).patch("/api/v1/deployments/chat", {"priority": "critical", "max_replicas": 3})
    assert r.status_code == 422 and refused_fields(r) == ["priority"] and "ceiling (high)" in refusal(r)
    assert Deployment.objects.values().get(name="chat") == before


def test_a_ceiling_lowered_later_leaves_existing_deployments_changeable_in_other_ways(client, ml):
    alice, _ = ml
    Team.objects.filter(name="ml").update(priority_ceiling="critical")
    create_deployment("chat", "tiny", priority="critical")
    Team.objects.filter(name="ml").update(priority_ceiling="standard")
    r = _api(client, alice).patch("/api/v1/deployments/chat", {"max_replicas": 3})
    assert r.status_code == 200, r.content
    assert Deployment.objects.get(name="chat").priority == "critical"


def test_a_bulk_create_with_one_deployment_above_the_ceiling_creates_none(client, ml):
    alice, _ = ml
    r = _api(client, alice).post("/api/v1/deployments/bulk", {"deployments": [
        {"name": "a", "model": "tiny", "priority": "high"}, {"name": "b", "model": "tiny", "priority": "critical"}]})
    assert r.status_code == 422, r.content
    assert "priority critical is above team ml's priority ceiling (high)" in refusal(r)
    assert not Deployment.objects.exists()


def test_the_policy_form_refuses_a_priority_above_the_ceiling_naming_it(client, ml):
    alice, _ = ml
    create_deployment("chat", "tiny", priority="standard", min_replicas=1, max_replicas=1)
    before = Deployment.objects.values().get(name="chat")
    client.login(username="alice", password="a-long-password")
    r = client.post("/deployments/chat/policy/", {"priority": "critical", "min_replicas": 1, "max_replicas": 1},
                    **HTMX)
    html = r.content.decode()
    assert r.status_code == 200 and 'class="msg-error" role="alert"' in html
    assert "priority critical is above team ml&#x27;s priority ceiling (high)" in html
    assert 'name="priority"' in html and 'aria-invalid="true"' in html
    assert Deployment.objects.values().get(name="chat") == before


def test_the_default_team_keeps_critical_so_an_upgrade_changes_nothing(client, model_dir):
    user = get_user_model().objects.create_user("ops")
    register_model("tiny", str(model_dir))
    r = _api(client, user).post("/api/v1/deployments", {"name": "chat", "model": "tiny", "priority": "critical"})
    assert r.status_code == 201, r.content
    assert Team.objects.get(name=DEFAULT_TEAM).priority_ceiling == "critical"


def test_the_django_admins_form_is_bound_by_the_ceiling_too(ml):
    from django.core.exceptions import ValidationError

    dep = create_deployment("chat", "tiny", priority="high")
    dep.priority = "critical"
    with pytest.raises(ValidationError, match="above team ml's priority ceiling") as e:
        dep.full_clean()
    assert list(e.value.message_dict) == ["priority"]
    Team.objects.filter(name="ml").update(priority_ceiling="standard")
    dep.refresh_from_db()
    dep.max_replicas = 2
    dep.full_clean()  # its priority unchanged: other changes are taken
