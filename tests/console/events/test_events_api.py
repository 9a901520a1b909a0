"""GET /api/v1/events: newest first, filtered by object, type, reason and time, paged by an opaque cursor."""

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from console.accounts.models import default_team_id
from console.events.models import Event
from console.events.record import Note, record

pytestmark = pytest.mark.django_db


@pytest.fixture
def timeline(api):
    Event.objects.all().delete()  # the API token's creation, told by the fixture
    t0 = timezone.now() - timedelta(minutes=10)
    ours = default_team_id()  # the team of the token's user: chat and other were its deployments
    notes = [
        (Note("deployment/chat", "Created", "deploys tiny", actor="user ann", deployment="chat"), 0),
        (Note("replica/chat#0", "Placed", "placed on h1/0", actor="scheduler", deployment="chat", host="h1"), 1),
        (Note("replica/chat#0", "Preempted", "preempted by crit#0 (critical, needs its minimum of 1 replica)",
              warning=True, actor="scheduler", deployment="chat", host="h1"), 2),
        (Note("host/h1", "Disconnected", "link closed", warning=True, host="h1"), 3),
        (Note("replica/other#0", "Placed", "placed on h2/0", deployment="other", host="h2"), 4),
    ]
    for note, minute in notes:
        record([note if note.object.startswith("host/") else replace(note, team=ours)], t0 + timedelta(minutes=minute))
    return t0


def test_it_lists_events_newest_first_in_the_documented_shape(api, timeline):
    body = api.get("/api/v1/events").json()
    assert [e["reason"] for e in body["events"]] == ["Placed", "Disconnected", "Preempted", "Placed", "Created"]
    assert body["next"] is None
    first = body["events"][2]
    assert {k: first[k] for k in ("object", "type", "reason", "message", "count", "actor")} == {
        "object": "replica/chat#0", "type": "Warning", "reason": "Preempted", "count": 1, "actor": "scheduler",
        "message": "preempted by crit#0 (critical, needs its minimum of 1 replica)"}
    assert first["time"] and first["first_time"]


def test_a_deployment_object_takes_its_replicas_events_and_a_host_its_replicas_there(api, timeline):
    chat = api.get("/api/v1/events?object=deployment/chat").json()["events"]
    assert [e["object"] for e in chat] == ["replica/chat#0", "replica/chat#0", "deployment/chat"]
    h1 = api.get("/api/v1/events?object=host/h1").json()["events"]
    assert [e["reason"] for e in h1] == ["Disconnected", "Preempted", "Placed"]
    one = api.get("/api/v1/events?object=replica/chat%230&reason=Placed").json()["events"]
    assert [e["message"] for e in one] == ["placed on h1/0"]


def test_type_and_since_filter(api, timeline):
    warnings = api.get("/api/v1/events?type=Warning").json()["events"]
    assert [e["reason"] for e in warnings] == ["Disconnected", "Preempted"]
    since = int((timeline + timedelta(minutes=2, seconds=30)).timestamp())
    assert [e["reason"] for e in api.get(f"/api/v1/events?since={since}").json()["events"]] == [
        "Placed", "Disconnected"]


def test_the_cursor_pages_through_every_event_once(api):
    Event.objects.all().delete()
    t0 = timezone.now() - timedelta(hours=1)
    for i in range(23):
        # Some share a time: the cursor must still neither repeat nor skip one.
        record([Note(f"host/h{i}", "Connected", "hello")], t0 + timedelta(seconds=i // 3))
    seen, url = [], "/api/v1/events?limit=5"
    for _ in range(10):
        body = api.get(url).json()
        seen += [e["object"] for e in body["events"]]
        if body["next"] is None:
            break
        url = f"/api/v1/events?limit=5&cursor={body['next']}"
    assert len(seen) == 23 and set(seen) == {f"host/h{i}" for i in range(23)}


@pytest.mark.parametrize("query, where, words", [
    ("cursor=bm9wZQ", "cursor", "not a cursor this API gave"),
    ("since=yesterday", "since", "neither unix seconds nor an ISO 8601 time"),
    ("object=chat", "object", "is not KIND/NAME"),
    ("limit=0", "limit", "greater than or equal to 1"),
    ("type=Error", "type", "Normal"),
])
def test_bad_parameters_are_refused_naming_the_parameter(api, query, where, words):
    r = api.get(f"/api/v1/events?{query}")
    assert r.status_code == 422
    (item,) = r.json()["detail"]
    assert item["loc"][-1] == where and words in item["msg"]


@pytest.mark.parametrize("query", ["reason=%13%00", "object=deployment/ch%00at", "object=host/h%001",
                                   "object=replica/chat%230%00"])
def test_a_filter_holding_a_nul_finds_nothing_instead_of_failing(api, timeline, query):
    """Schemathesis found it on PostgreSQL, which refuses a NUL in a query: a 500. No event's fields hold one."""
    r = api.get(f"/api/v1/events?{query}")
    assert r.status_code == 200 and r.json() == {"events": [], "next": None}


def test_it_needs_a_token_or_session(client, db):
    assert client.get("/api/v1/events").status_code == 401
