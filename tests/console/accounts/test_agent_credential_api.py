"""/api/v1/agent-credentials: an admin (staff) lists the hosts' agent tokens (never the secret), issues or
rotates one for a host name (the secret once), and revokes one, which ends that host's links. Anyone else gets
403 and changes nothing."""

import json

import pytest
from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken
from console.events.models import Event
from console.fleet.models import AgentCredential, Host
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db
SHOWN = {"host_name", "prefix", "created", "last_used", "connected"}


def _caller(client, user):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(user)[1]}"}

    class Caller:
        def get(self, url):
            return client.get(f"/api/v1{url}", **auth)

        def post(self, url, body):
            return client.post(f"/api/v1{url}", data=json.dumps(body), content_type="application/json", **auth)

        def delete(self, url):
            return client.delete(f"/api/v1{url}", **auth)

    return Caller()


@pytest.fixture
def as_root(client):
    return _caller(client, get_user_model().objects.create_user("root", is_staff=True))


@pytest.fixture
def as_ops(client):
    return _caller(client, get_user_model().objects.create_user("ops"))


@pytest.fixture
def revoked_hosts(monkeypatch):
    ended = []
    monkeypatch.setattr("console.control.layer.revoke_links", ended.append)
    return ended


def test_an_admin_issues_a_token_for_a_host_and_sees_it_listed_without_the_secret(as_root):
    r = as_root.post("/agent-credentials", {"host_name": "gpu-1"})
    assert r.status_code == 201, r.content
    body = r.json()
    secret = body.pop("token")
    assert body["host_name"] == "gpu-1" and body["rotated"] is False and body["prefix"] in secret
    assert AgentCredential.authenticate(secret).host_name == "gpu-1"
    listed = as_root.get("/agent-credentials")
    assert listed.status_code == 200 and secret not in listed.content.decode()
    assert [set(c) for c in listed.json()] == [SHOWN] and listed.json()[0]["connected"] is False


def test_issuing_again_rotates_and_ends_the_links_made_with_the_old_token(as_root, revoked_hosts,
                                                                       django_capture_on_commit_callbacks):
    host = Host.objects.create(name="gpu-1", connected=True)
    first = as_root.post("/agent-credentials", {"host_name": "gpu-1"}).json()["token"]
    with django_capture_on_commit_callbacks(execute=True):
        r = as_root.post("/agent-credentials", {"host_name": "gpu-1"})
    assert r.status_code == 201 and r.json()["rotated"] is True
    assert AgentCredential.authenticate(first) is None
    assert revoked_hosts == [host.pk]


def test_revoking_deletes_the_token_ends_the_hosts_links_and_tells_the_timeline(as_root, revoked_hosts,
                                                                             django_capture_on_commit_callbacks):
    host = Host.objects.create(name="gpu-1", connected=True)
    secret = as_root.post("/agent-credentials", {"host_name": "gpu-1"}).json()["token"]
    with django_capture_on_commit_callbacks(execute=True):
        assert as_root.delete("/agent-credentials/gpu-1").status_code == 204
    assert AgentCredential.authenticate(secret) is None and not AgentCredential.objects.exists()
    assert revoked_hosts == [host.pk]
    event = Event.objects.get(reason="TokenRevoked")
    assert event.object == "host/gpu-1" and event.host == "gpu-1" and event.actor.startswith("token ")


def test_revoking_a_host_without_a_token_is_404_naming_it(as_root):
    r = as_root.delete("/agent-credentials/ghost")
    assert r.status_code == 404 and "no agent token for host 'ghost'" in refusal(r)


@pytest.mark.parametrize("name", ["", "two words", "tab\there", "x" * 201, "gpu-\u0430", "gpu/1", "gpu?1", "gpu#1"])
def test_a_bad_host_name_is_422_naming_the_field_and_issues_nothing(as_root, name):
    r = as_root.post("/agent-credentials", {"host_name": name})
    assert r.status_code == 422 and refused_fields(r) == ["host_name"], r.content
    assert not AgentCredential.objects.exists()


def test_a_look_alike_letter_of_another_script_is_named_in_the_refusal(as_root):
    r = as_root.post("/agent-credentials", {"host_name": "gpu-\u0430"})
    assert "has 'а' (CYRILLIC SMALL LETTER A, U+0430: host names are ASCII) at position 4" in refusal(r)


def test_anyone_but_an_admin_is_refused_with_403_and_changes_nothing(as_ops, revoked_hosts):
    _, secret = AgentCredential.issue("gpu-1")
    for r in (as_ops.get("/agent-credentials"), as_ops.post("/agent-credentials", {"host_name": "gpu-2"}),
              as_ops.post("/agent-credentials", {"host_name": "gpu-1"}), as_ops.delete("/agent-credentials/gpu-1")):
        assert r.status_code == 403 and "only staff" in refusal(r), r.content
    assert AgentCredential.authenticate(secret).host_name == "gpu-1"
    assert list(AgentCredential.objects.values_list("host_name", flat=True)) == ["gpu-1"]
    assert revoked_hosts == []
