"""Alerts by team: a member is told of their teams' deployments' and replicas' alerts and of every host's (hosts are
shared), never of another team's deployment, which reads as if it did not exist; admins are told of all."""

import pytest
from django.utils import timezone

from console.alerts.models import Alert, AlertRule
from tests.console.team_scene import PASSWORD, calls_as, team_scene

pytestmark = pytest.mark.django_db


@pytest.fixture
def scene(tmp_path):
    scene = team_scene(tmp_path)
    rules = {r.kind: r for r in AlertRule.in_force()}
    for rule, obj in (("slo_violation", "deployment/chat-a"), ("slo_violation", "deployment/chat-b"),
                      ("replica_failing", "replica/chat-b#0"), ("host_offline", "host/h1")):
        Alert.objects.create(rule=rules[rule], object=obj, message=f"{obj} is in trouble", since=timezone.now())
    return scene


def test_the_api_lists_a_members_teams_alerts_and_every_hosts(client, scene):
    call = calls_as(client, scene)
    seen = {user: {a["object"] for a in call(user, "get", "/api/v1/alerts").json()} for user in ("alice", "root")}
    assert seen["alice"] == {"deployment/chat-a", "host/h1"}
    assert seen["root"] == {"deployment/chat-a", "deployment/chat-b", "replica/chat-b#0", "host/h1"}


def test_the_dashboards_banner_names_no_other_teams_deployment(client, scene):
    client.login(username="alice", password=PASSWORD)
    for page in (client.get("/").content.decode(), client.get("/alerts/banner/").content.decode()):
        assert "deployment/chat-a is in trouble" in page and "host/h1 is in trouble" in page
        assert "chat-b" not in page
