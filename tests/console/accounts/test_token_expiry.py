"""Tokens that expire, and tokens that were revoked: the REST API refuses them with 401 saying which and when (a
token it does not know stays a plain 401), never marks them used, and `createapitoken --expires-in` makes one."""

from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from console.accounts.models import ApiToken
from tests.refusals import refusal

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops():
    return get_user_model().objects.create_user("ops")


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def stamp(when) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_expired_token_is_refused_by_the_rest_api_naming_when_it_expired(client, ops):
    when = timezone.now() - timedelta(minutes=5)
    row, token = ApiToken.issue(ops, "ci", expires=when)
    r = client.get("/api/v1/deployments", **bearer(token))
    assert r.status_code == 401
    assert refusal(r).startswith(f"token expired at {stamp(when)} ('ci', {row.prefix}…)")
    assert r.json()["detail"][0]["type"] == "unauthorized"


def test_a_token_works_until_it_expires(client, ops):
    _, token = ApiToken.issue(ops, "ci", expires=timezone.now() + timedelta(hours=1))
    assert client.get("/api/v1/deployments", **bearer(token)).status_code == 200


def test_a_revoked_token_is_refused_naming_when_it_was_revoked(client, ops):
    row, token = ApiToken.issue(ops, "ci")
    row.revoke(actor="test")
    row.refresh_from_db()
    r = client.get("/api/v1/deployments", **bearer(token))
    assert r.status_code == 401
    assert refusal(r).startswith(f"token revoked at {stamp(row.revoked)} ('ci', {row.prefix}…)")


def test_a_refused_token_is_refused_even_beside_a_session(user_client, ops):
    # A script that sends a token means that token: a signed-in browser's cookie does not rescue it.
    _, token = ApiToken.issue(ops, expires=timezone.now() - timedelta(seconds=1))
    assert user_client.get("/api/v1/deployments", **bearer(token)).status_code == 401


def test_a_refused_token_is_never_marked_used(client, ops):
    _, token = ApiToken.issue(ops, expires=timezone.now() - timedelta(seconds=1))
    client.get("/api/v1/deployments", **bearer(token))
    assert ApiToken.objects.get().last_used is None
    assert ApiToken.authenticate(token) is None


def test_verify_gives_the_row_and_why_it_is_refused(ops):
    row, token = ApiToken.issue(ops, "ci")
    assert ApiToken.verify(token) == (row, "")
    row.revoke()
    found, why = ApiToken.verify(token)
    assert found == row and why.startswith("token revoked at ")
    assert ApiToken.verify("mg_api_nonsense") == (None, "")


def test_revoking_twice_keeps_the_first_time_and_tells_the_timeline_once(ops):
    from console.events.models import Event

    row, _ = ApiToken.issue(ops, "ci")
    assert row.revoke(actor="user ann") is True
    first = ApiToken.objects.get().revoked
    assert row.revoke(actor="user ann") is False
    assert ApiToken.objects.get().revoked == first
    revoked = Event.objects.filter(reason="TokenRevoked")
    assert [(e.object, e.actor) for e in revoked] == [("token/ops/ci", "user ann")]


def test_issuing_records_the_expiry_and_deployments_on_the_timeline(ops):
    from console.events.models import Event

    when = timezone.now() + timedelta(days=30)
    ApiToken.issue(ops, "bot", scope="inference", expires=when, deployments=["chat"], actor="user ann")
    event = Event.objects.get(reason="TokenCreated")
    assert f"expires {stamp(when)}" in event.message and "limited to 1 deployment(s)" in event.message


def test_createapitoken_makes_a_token_that_expires_when_asked():
    out = StringIO()
    call_command("createapitoken", "robot", "--expires-in", "30d", stdout=out, stderr=StringIO())
    row = ApiToken.authenticate(out.getvalue().strip())
    assert abs(row.expires - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)


def test_createapitoken_refuses_a_bad_expiry_naming_it_and_creates_nobody():
    with pytest.raises(CommandError) as e:
        call_command("createapitoken", "robot", "--expires-in", "soon", stdout=StringIO(), stderr=StringIO())
    assert "--expires-in" in str(e.value) and "'soon'" in str(e.value) and "30d" in str(e.value)
    assert not get_user_model().objects.filter(username="robot").exists()
    assert not ApiToken.objects.exists()
