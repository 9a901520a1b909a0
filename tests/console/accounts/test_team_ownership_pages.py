"""Ownership on the pages: signed in as a member of team a, team b's deployment page, its status, logs, policy form,
delete and adapters answer as if they did not exist, and the models page lists only team a's models."""

import pytest

from console.catalog.models import Adapter
from console.deployments.models import Deployment
from tests.console.team_scene import PASSWORD, team_scene

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def alice(client, tmp_path):
    team_scene(tmp_path)
    client.login(username="alice", password=PASSWORD)
    return client


def test_another_teams_deployment_page_is_not_found(alice):
    assert alice.get("/deployments/chat-a/").status_code == 200
    assert alice.get("/deployments/chat-b/").status_code == 404
    assert alice.get("/deployments/chat-b/status/").status_code == 404


def test_another_teams_deployment_reads_as_gone_where_the_page_polls(alice):
    status = alice.get("/deployments/chat-b/status/", **HTMX)
    logs = alice.get("/deployments/chat-b/logs/?replica=0", **HTMX)
    assert status.status_code == logs.status_code == 286  # htmx: stop polling
    assert b"chat-b" in status.content and b"replica" not in logs.content.lower()


def test_another_teams_deployment_cannot_be_changed_or_deleted_from_a_page(alice):
    assert alice.post("/deployments/chat-b/policy/", {"max_replicas": 3}).status_code == 404
    assert alice.post("/deployments/chat-b/delete/").status_code == 404
    assert alice.post("/adapters/sql-b/delete/").status_code == 404
    assert alice.post("/adapters/sql-b/edit/", {"pinned": "on"}).status_code == 404
    assert alice.post("/models/tiny-b/edit/", {"path": "/nowhere"}).status_code == 404
    assert Deployment.objects.get(name="chat-b").max_replicas == 1
    assert Adapter.objects.filter(name="sql-b", pinned=False).exists()


def test_the_models_page_lists_only_the_users_teams_models(alice):
    page = alice.get("/models/").content.decode()
    assert "tiny-a" in page and "/models/tiny-b/" not in page


def test_another_teams_model_cannot_be_deployed_from_a_page(alice):
    alice.post("/models/tiny-b/deploy/", {})
    assert not Deployment.objects.filter(model__name="tiny-b").exclude(name="chat-b").exists()


def test_another_teams_deployment_charts_read_as_gone(alice):
    assert alice.get("/deployments/chat-a/charts/", **HTMX).status_code == 200
    assert alice.get("/deployments/chat-b/charts/", **HTMX).status_code == 286


def test_the_timeline_page_and_cards_leave_out_another_teams_objects(alice):
    page = alice.get("/events/").content.decode()
    card = alice.get("/events/recent/?object=deployment/chat-b").content.decode()
    assert "chat-a" in page and "chat-b" not in page and "tiny-b" not in page
    assert "chat-b" not in card.replace("object=deployment/chat-b", "")


def test_a_member_of_several_teams_chooses_the_team_of_a_model_registered_from_the_page(alice, tmp_path):
    from django.contrib.auth import get_user_model

    from console.accounts.models import Team
    from console.catalog.models import Model
    from tests.conftest import write_model_dir

    Team.objects.get(name="team-b").members.add(get_user_model().objects.get(username="alice"))
    assert '<select name="team">' in alice.get("/models/").content.decode()
    alice.post("/models/register/", {"name": "m2", "path": str(write_model_dir(tmp_path / "m2")), "team": "team-b"})
    assert Model.objects.get(name="m2").team.name == "team-b"


def test_the_dashboard_lists_the_users_deployments_and_leaves_other_teams_replicas_unnamed(alice):
    from console.deployments.models import Replica
    from console.fleet.models import Gpu, Host

    host = Host.objects.create(name="h1", endpoint="http://127.0.0.1:9", connected=True)
    gpu = Gpu.objects.create(host=host, index=0, uuid="SIM-0", name="sim", total_bytes=8 << 30, simulated=True)
    for dep in Deployment.objects.all():
        replica = Replica.objects.create(deployment=dep, index=0, host=host, desired_state="ready",
                                         observed_state="ready", reserved_bytes=1 << 30, reason=f"placed {dep.name}")
        replica.gpus.add(gpu)
    for page in (alice.get("/").content.decode(), alice.get("/hosts/h1/").content.decode()):
        assert "chat-a" in page and "chat-b" not in page
        assert "another team" in page


@pytest.mark.django_db(transaction=True)
async def test_the_live_dashboard_pushes_only_the_users_teams_deployments(tmp_path):
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from console.asgi import application

    def sign_in() -> bytes:
        team_scene(tmp_path)
        browser = Client()
        assert browser.login(username="alice", password=PASSWORD)
        return f"sessionid={browser.cookies['sessionid'].value}".encode()

    cookie = await database_sync_to_async(sign_in)()
    comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=[
        (b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1"), (b"cookie", cookie)])
    connected, _ = await comm.connect()
    assert connected
    grid = await comm.receive_from(timeout=5)
    await comm.disconnect()
    assert "chat-a" in grid and "chat-b" not in grid
