"""The events page, the recent-events card on deployment and host pages, and the host page itself."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from console.accounts.models import default_team_id
from console.events.models import Event
from console.events.record import Note, record

pytestmark = pytest.mark.django_db


def rows(html: str) -> list[str]:
    return re.findall(r'<tr class="event type-\w+" data-reason="(\w+)" data-object="([^"]+)"', html)


@pytest.fixture
def timeline(db):
    t0 = timezone.now() - timedelta(minutes=30)
    ours = default_team_id()  # the team every user joins: chat and other were its deployments
    record([Note("replica/chat#0", "Preempted", "preempted by crit#0 (critical, needs its minimum of 1 replica)",
                 warning=True, actor="scheduler", deployment="chat", host="h1", team=ours)], t0)
    record([Note("host/h1", "Disconnected", "link closed", warning=True, host="h1")], t0 + timedelta(minutes=1))
    record([Note("deployment/other", "Created", "deploys tiny", actor="user ann", deployment="other", team=ours)],
           t0 + timedelta(minutes=2))
    return t0


def test_the_events_page_lists_the_timeline_with_filters(user_client, timeline):
    page = user_client.get("/events/").content.decode()
    assert rows(page) == [("Created", "deployment/other"), ("Disconnected", "host/h1"), ("Preempted", "replica/chat#0")]
    assert "preempted by crit#0 (critical, needs its minimum of 1 replica)" in page
    assert '<a href="/deployments/chat/">replica/chat#0</a>' in page and '<a href="/hosts/h1/">host/h1</a>' in page
    warnings = user_client.get("/events/?type=Warning&object=host/h1").content.decode()
    assert rows(warnings) == [("Disconnected", "host/h1"), ("Preempted", "replica/chat#0")]


def test_a_bad_filter_is_shown_not_a_server_error(user_client, timeline):
    r = user_client.get("/events/?object=nonsense&cursor=zzz")
    assert r.status_code == 200 and "is not KIND/NAME" in r.content.decode()


def test_a_filter_holding_a_nul_shows_no_events_not_a_server_error(user_client, timeline):
    r = user_client.get("/events/?reason=Placed%00&object=host/h%001")
    assert r.status_code == 200 and rows(r.content.decode()) == []


def test_older_pages_follow_the_cursor_and_stop_following_new_events(user_client, db):
    t0 = timezone.now() - timedelta(hours=2)
    for i in range(60):
        record([Note(f"host/h{i:02}", "Connected", "hello")], t0 + timedelta(seconds=i))
    first = user_client.get("/events/").content.decode()
    assert len(rows(first)) == 50 and 'hx-trigger="every 5s"' in first
    older = re.search(r'class="older" href="\?cursor=([^"]+)"', first).group(1)
    second = user_client.get(f"/events/?cursor={older}").content.decode()
    assert [o for _, o in rows(second)] == [f"host/h{i:02}" for i in range(9, -1, -1)]
    assert 'hx-trigger="every 5s"' not in second.split('id="event-table"')[1].split(">")[0]


def test_the_events_page_needs_a_session(client, db):
    assert client.get("/events/").status_code == 302


def test_the_deployment_page_shows_its_replicas_events(user_client, model, timeline):
    from console.deployments.services import create_deployment

    create_deployment("chat", "tiny")
    page = user_client.get("/deployments/chat/").content.decode()
    card = page[page.index('id="events"'):]
    assert [r for r, _ in rows(card)] == ["Created", "Preempted"]
    fragment = user_client.get("/events/recent/?object=deployment/chat").content.decode()
    assert [r for r, _ in rows(fragment)] == ["Created", "Preempted"]


def test_the_host_page_shows_its_gpus_and_events(user_client, host, timeline):
    Event.objects.filter(object="host/h1").update(message="link closed by the test")
    page = user_client.get("/hosts/h1/").content.decode()
    assert 'data-gpu="h1/0"' in page and 'data-gpu="h1/1"' in page
    assert "link closed by the test" in page and ("Preempted", "replica/chat#0") in rows(page)
    assert user_client.get("/hosts/nope/").status_code == 404


def test_a_shared_hosts_page_lists_its_replicas_events_of_the_readers_teams_only(client, tmp_path):
    from tests.console.team_scene import PASSWORD, shared_scene

    shared_scene(tmp_path)
    seen = {}
    for user in ("bob", "root"):
        client.login(username=user, password=PASSWORD)
        page = client.get("/hosts/h1/").content.decode()
        card = client.get("/events/recent/?object=host/h1").content.decode()
        assert sorted(rows(card)) == sorted(rows(page[page.index('id="events"'):]))  # first render as polled
        seen[user] = sorted(obj for _, obj in rows(card))
    assert seen == {"bob": ["replica/chat-b#0"], "root": ["replica/chat-a#0", "replica/chat-b#0"]}
