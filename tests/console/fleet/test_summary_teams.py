"""The dashboard's summary counts a member's teams' deployments and replicas only (on the page and in its live
updates, which render grid_context for the viewer's teams); hosts, GPUs and their memory stay the whole fleet's,
since every team shares them. Admins count everything."""

import re

import pytest
from django.contrib.auth import get_user_model

from console.accounts.scope import TeamScope
from console.deployments.models import Deployment, Replica
from console.fleet.models import Gpu, Host
from console.fleet.views import grid_context
from tests.console.team_scene import PASSWORD, team_scene
from tests.console.test_dashboard_page import summary_card

pytestmark = pytest.mark.django_db
GiB = 1024**3


@pytest.fixture
def scene(tmp_path):
    """chat-a with one ready replica; chat-b with a ready and a sleeping one, and missing its SLO; one GPU."""
    scene = team_scene(tmp_path)
    host = Host.objects.create(name="h1", connected=True)
    gpu = Gpu.objects.create(host=host, index=0, uuid="g0", name="sim", total_bytes=80 * GiB)
    for name, states in (("chat-a", ["ready"]), ("chat-b", ["ready", "sleeping"])):
        dep = Deployment.objects.get(name=name)
        for i, state in enumerate(states):
            Replica.objects.create(deployment=dep, index=i, host=host, observed_state=state,
                                   reserved_bytes=10 * GiB).gpus.add(gpu)
    Deployment.objects.filter(name="chat-b").update(violating=True)
    return scene


def _counts(user: str) -> dict:
    summary = grid_context(None, TeamScope.of(get_user_model().objects.get(username=user)))["summary"]
    return {"deployments": summary["deployments"]["total"], "violating": summary["deployments"]["violating"],
            "replicas": {s["state"]: s["count"] for s in summary["replicas"]["states"]},
            "gpus": summary["gpus"]["count"], "hosts": summary["hosts"]["total"],
            "teams_only": summary["teams_only"]}


def test_a_member_counts_their_teams_deployments_and_replicas_and_the_whole_fleets_gpus(scene):
    assert _counts("alice") == {"deployments": 1, "violating": 0, "replicas": {"ready": 1}, "gpus": 1, "hosts": 1,
                                "teams_only": True}
    assert _counts("bob") == {"deployments": 1, "violating": 1, "replicas": {"ready": 1, "sleeping": 1}, "gpus": 1,
                              "hosts": 1, "teams_only": True}


def test_an_admin_counts_every_team(scene):
    assert _counts("root") == {"deployments": 2, "violating": 1, "replicas": {"ready": 2, "sleeping": 1}, "gpus": 1,
                               "hosts": 1, "teams_only": False}


def test_the_page_shows_a_members_counts_and_says_whose_they_are(client, scene):
    client.login(username="alice", password=PASSWORD)
    html = client.get("/").content.decode()
    replicas, deployments = summary_card(html, "replicas"), summary_card(html, "deployments")
    assert '<span class="stat-value">1</span>' in replicas and "· your teams" in replicas
    assert '<span class="stat-value">1</span>' in deployments and "violating" not in deployments
    # Memory is the shared GPUs': every team's reservations (3 x 10 GiB of 80 GiB).
    assert "30.00 GiB" in summary_card(html, "memory")
    assert re.findall(r'data-deployment-state="(\w+)"[^>]*><i></i><b>(\d+)</b>', deployments) == [
        (Deployment.objects.get(name="chat-a").state, "1")]
