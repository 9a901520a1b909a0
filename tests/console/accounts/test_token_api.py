"""/api/v1/tokens: list (never the secret), create (the secret once; an expiry and a scope, per deployment too),
revoke. A user sees and revokes only their own tokens, an admin (staff) everyone's; every refusal is a 4xx naming
what is wrong, and a refused request changes nothing."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from console.accounts.models import ApiToken
from console.events.models import Event
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db
SHOWN = {"id", "prefix", "name", "user", "scope", "deployments", "created", "last_used", "expires", "expired",
         "rpm_limit", "tpm_limit"}


@pytest.fixture
def ops():
    return get_user_model().objects.create_user("ops")


@pytest.fixture
def root():
    return get_user_model().objects.create_user("root", is_staff=True)


class Caller:
    def __init__(self, client, token: str) -> None:
        self.client, self.token = client, token
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    def get(self, url):
        return self.client.get(f"/api/v1{url}", **self.auth)

    def post(self, url, body):
        return self.client.post(f"/api/v1{url}", data=json.dumps(body), content_type="application/json", **self.auth)

    def delete(self, url):
        return self.client.delete(f"/api/v1{url}", **self.auth)


@pytest.fixture
def as_ops(client, ops):
    return Caller(client, ApiToken.issue(ops, "ops-cli")[1])


@pytest.fixture
def as_root(client, root):
    return Caller(client, ApiToken.issue(root, "root-cli")[1])


def test_creating_a_token_answers_its_secret_once_and_the_list_never_shows_it(as_ops, client):
    r = as_ops.post("/tokens", {"name": "ci", "expires_in": "30d"})
    assert r.status_code == 201, r.content
    created = r.json()
    secret = created.pop("token")
    assert set(created) == SHOWN and created["name"] == "ci" and created["user"] == "ops"
    assert created["scope"] == "all" and created["deployments"] == [] and created["expired"] is False
    assert created["prefix"] in secret and created["last_used"] is None
    row = ApiToken.objects.get(pk=created["id"])
    assert abs(row.expires - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)

    listed = as_ops.get("/tokens")
    assert listed.status_code == 200 and secret not in listed.content.decode()
    assert {t["name"] for t in listed.json()} == {"ops-cli", "ci"}
    assert all(set(t) == SHOWN for t in listed.json())
    assert Caller(client, secret).get("/deployments").status_code == 200


def test_a_token_may_expire_at_a_moment_given_with_its_time_zone(as_ops):
    when = (timezone.now() + timedelta(days=365)).replace(microsecond=0)
    r = as_ops.post("/tokens", {"name": "ci", "expires": when.isoformat()})
    assert r.status_code == 201, r.content
    assert ApiToken.objects.get(name="ci").expires == when


def test_a_token_may_be_limited_to_deployments_for_inference(as_ops, model):
    from console.deployments.services import create_deployment

    create_deployment("chat", "tiny", replicas=0)
    r = as_ops.post("/tokens", {"name": "chatbot", "scope": "inference", "deployments": ["chat", "chat"]})
    assert r.status_code == 201, r.content
    assert r.json()["deployments"] == ["chat"]
    assert ApiToken.objects.get(name="chatbot").deployments == ["chat"]


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"name": "ci", "expires_in": "soon"}, "expires_in", "is not a lifetime"),
    ({"name": "ci", "expires_in": 0}, "expires_in", "at least 1 minute"),
    ({"name": "ci", "expires": "2000-01-01T00:00:00Z"}, "expires", "is not in the future"),
    ({"name": "ci", "expires": "2099-01-01T00:00:00"}, "expires", "has no time zone"),
    ({"name": "ci", "expires_in": "1d", "expires": "2099-01-01T00:00:00Z"}, "expires_in", "not both"),
    ({"name": "  "}, "name", "is empty"),
    ({"name": "ci", "scope": "admin"}, "scope", "all"),
    ({"name": "ci", "scope": "inference", "deployments": ["ghost"]}, "deployments", "no deployment named 'ghost'"),
    ({"name": "ci", "deployments": ["ghost"]}, "deployments", "scope inference"),
    ({"name": "ci", "user": "nobody"}, "user", "no user named 'nobody'"),
    ({"name": "ci", "secret": "x"}, "secret", ""),
])
def test_a_bad_field_is_422_naming_it_and_creates_nothing(as_root, body, field, words):
    before = ApiToken.objects.count()
    r = as_root.post("/tokens", body)
    assert r.status_code == 422, r.content
    assert field in refused_fields(r) and words in refusal(r)
    assert ApiToken.objects.count() == before
    assert not Event.objects.filter(reason="TokenCreated", actor__startswith="token").exists()


def test_a_user_sees_only_their_tokens_and_an_admin_sees_everyones(as_ops, as_root):
    assert {t["user"] for t in as_ops.get("/tokens").json()} == {"ops"}
    assert {t["user"] for t in as_root.get("/tokens").json()} == {"ops", "root"}


def test_an_admin_may_make_a_token_for_another_user_and_a_user_may_not(as_ops, as_root, root):
    r = as_root.post("/tokens", {"name": "for-ops", "user": "ops"})
    assert r.status_code == 201 and r.json()["user"] == "ops"
    before = ApiToken.objects.count()
    r = as_ops.post("/tokens", {"name": "for-root", "user": "root"})
    assert r.status_code == 403 and "only staff" in refusal(r)
    assert ApiToken.objects.count() == before


def test_a_token_cannot_make_a_token_that_outlives_it(client, ops):
    soon = timezone.now() + timedelta(hours=1)
    caller = Caller(client, ApiToken.issue(ops, "short", expires=soon)[1])
    for body in ({"name": "forever"}, {"name": "longer", "expires_in": "2h"}):
        r = caller.post("/tokens", body)
        assert r.status_code == 403 and "may not outlive it" in refusal(r), r.content
    assert ApiToken.objects.count() == 1
    assert caller.post("/tokens", {"name": "shorter", "expires_in": "30m"}).status_code == 201


def test_revoking_refuses_the_token_at_once_and_tells_the_timeline(as_ops, client):
    created = as_ops.post("/tokens", {"name": "ci"}).json()
    assert as_ops.delete(f"/tokens/{created['id']}").status_code == 204
    r = Caller(client, created["token"]).get("/deployments")
    assert r.status_code == 401 and refusal(r).startswith("token revoked at ")
    assert "ci" not in {t["name"] for t in as_ops.get("/tokens").json()}
    event = Event.objects.get(reason="TokenRevoked")
    assert event.object == "token/ops/ci" and event.actor == "token ops-cli (ops)"


def test_revoking_again_or_an_unknown_token_is_404(as_ops):
    created = as_ops.post("/tokens", {"name": "ci"}).json()
    as_ops.delete(f"/tokens/{created['id']}")
    r = as_ops.delete(f"/tokens/{created['id']}")
    assert r.status_code == 404 and "already revoked" in refusal(r)
    r = as_ops.delete("/tokens/999999")
    assert r.status_code == 404 and "no token 999999" in refusal(r)


def test_a_user_cannot_revoke_another_users_token_and_an_admin_can(as_ops, as_root, root):
    theirs = ApiToken.objects.get(user=root)
    r = as_ops.delete(f"/tokens/{theirs.pk}")
    assert r.status_code == 404 and ApiToken.objects.get(pk=theirs.pk).revoked is None
    ours = ApiToken.objects.get(user__username="ops")
    assert as_root.delete(f"/tokens/{ours.pk}").status_code == 204
    assert ApiToken.objects.get(pk=ours.pk).revoked is not None


def test_an_expired_token_is_listed_as_expired(as_ops, ops):
    ApiToken.issue(ops, "old", expires=timezone.now() - timedelta(days=1))
    listed = {t["name"]: t for t in as_ops.get("/tokens").json()}
    assert listed["old"]["expired"] is True and listed["ops-cli"]["expired"] is False


def test_a_signed_in_browser_manages_its_tokens_with_its_session(user_client):
    r = user_client.post("/api/v1/tokens", data=json.dumps({"name": "laptop"}), content_type="application/json")
    assert r.status_code == 201 and r.json()["user"] == "ann"
    assert [t["name"] for t in user_client.get("/api/v1/tokens").json()] == ["laptop"]
