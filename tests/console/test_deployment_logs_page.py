"""The deployment page's Worker logs card: a replica selector and a tail polled every 2 s, which shows the lines,
or the refusal's words when the host is offline or its agent does not answer (the agent's side of the round trip
is in tests/console/realtime/test_agent_logs.py)."""

import html
import re

import pytest
from django.test import Client

from console.deployments import views
from console.deployments.models import Deployment, Replica
from console.fleet import logs
from console.fleet.models import Host

# The tail view reads the database on a thread of its own (PostgreSQL): the rows must be committed to be seen there.
pytestmark = pytest.mark.django_db(transaction=True)
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def chat(model):
    return Deployment.objects.create(name="chat", model=model)


def card(page: str) -> str:
    match = re.search(r'<section class="card worker-logs".*?</section>', page, re.S)
    assert match, "no Worker logs card"
    return match.group(0)


def tail(client, index=0, name="chat"):
    return client.get(f"/deployments/{name}/logs/?replica={index}", **HTMX)


def test_the_card_offers_each_replica_and_polls_the_tail_of_the_one_chosen(user_client, chat, host):
    Replica.objects.create(deployment=chat, index=0, host=host, observed_state="ready")
    Replica.objects.create(deployment=chat, index=1, observed_state="pending")
    shown = card(user_client.get("/deployments/chat/").content.decode())
    assert '<option value="0">#0 · ready on h1</option>' in shown
    assert '<option value="1">#1 · pending, not placed</option>' in shown
    assert 'hx-get="/deployments/chat/logs/"' in shown and 'hx-include="#log-replica"' in shown
    assert 'hx-trigger="load, every 2s, change from:#log-replica"' in shown


def test_without_replicas_the_card_says_so_and_polls_nothing(user_client, chat):
    shown = card(user_client.get("/deployments/chat/").content.decode())
    assert "No replicas, so no worker has written anything yet." in shown and "hx-get" not in shown


def test_the_tail_shows_the_lines_escaped(user_client, chat, monkeypatch):
    asked = []

    async def lines(deployment, index, tail):
        asked.append((deployment, index, tail))
        return ["INFO worker 7: ready", "<script>alert(1)</script>"]

    monkeypatch.setattr(views, "replica_logs", lines)
    response = tail(user_client, 3)
    assert response.status_code == 200 and asked == [("chat", 3, 200)]
    body = response.content.decode()
    assert '<pre class="log-lines" data-log-lines="2">INFO worker 7: ready\n&lt;script&gt;' in body
    assert "<script>" not in body


def test_a_host_whose_agent_is_offline_is_shown_as_the_refusal_says(user_client, chat, host):
    Host.objects.filter(pk=host.pk).update(connected=False)
    Replica.objects.create(deployment=chat, index=0, host=host)
    response = tail(user_client)
    assert response.status_code == 200  # htmx swaps only a success: the refusal is the fragment's content
    assert "host h1 is offline: its agent is not connected, so the log of replica 0 of &#x27;chat&#x27; cannot be " \
        "read until it reconnects" in response.content.decode()
    assert 'role="alert"' in response.content.decode()


def test_an_agent_that_does_not_answer_is_shown_too(user_client, chat, host, monkeypatch):
    monkeypatch.setattr(logs, "REPLY_TIMEOUT", 0.2)
    Replica.objects.create(deployment=chat, index=0, host=host)  # connected, but no agent link in this test
    text = html.unescape(tail(user_client).content.decode())
    assert "the agent on h1 did not answer within 0.2 s" in text


def test_a_replica_that_is_not_there_is_said_and_a_deleted_deployment_stops_the_polling(user_client, chat):
    assert "deployment 'chat' has no replica 4 (it has no replicas now)" in html.unescape(
        tail(user_client, 4).content.decode())
    assert "has no replica -1" in html.unescape(tail(user_client, "x").content.decode())
    gone = tail(user_client, 0, name="ghost")
    assert gone.status_code == 286 and "Deployment ghost was deleted" in gone.content.decode()


def test_the_tail_needs_a_signed_in_user(chat):
    redirect = tail(Client()).headers["HX-Redirect"]  # the whole browser goes to the login page
    assert redirect == "/accounts/login/?next=%2Fdeployments%2Fchat%2Flogs%2F%3Freplica%3D0"
    plain = Client().get("/deployments/chat/logs/")
    assert plain.status_code == 302 and plain.headers["Location"].startswith("/accounts/login/")
