"""The Tokens page and a token's own limits: the create form takes requests and tokens per minute, the list shows
them, and a small form on each row changes them as PATCH /api/v1/tokens/ID does (on the timeline with who). A bad
value comes back beside the field and changes nothing; another person's token cannot be changed."""

import pytest
from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken
from console.events.models import Event

pytestmark = pytest.mark.django_db


def row_of(html: str, token: ApiToken) -> str:
    return html.split(f'data-token="{token.pk}"', 1)[1].split("</tr>", 1)[0]


def test_a_token_is_made_with_limits_and_the_list_shows_them(user_client):
    r = user_client.post("/tokens/new/", {"name": "etl", "scope": "all", "rpm_limit": "600", "tpm_limit": ""})
    assert r.status_code == 200
    token = ApiToken.objects.get(name="etl")
    assert (token.rpm_limit, token.tpm_limit) == (600, None)
    row = row_of(user_client.get("/tokens/").content.decode(), token)
    assert 'name="rpm_limit" class="num" inputmode="numeric" placeholder="none"\n            value="600"' in row
    assert f'action="/tokens/{token.pk}/limits/"' in row


def test_a_bad_limit_makes_no_token(user_client):
    r = user_client.post("/tokens/new/", {"name": "etl", "scope": "all", "rpm_limit": "-5"}, follow=True)
    assert "Token not created: rpm_limit must be a whole number from 1 to" in r.content.decode()
    r = user_client.post("/tokens/new/", {"name": "etl", "scope": "all", "tpm_limit": "many"}, follow=True)
    assert "Token not created: tpm_limit must be a whole number, got &#x27;many&#x27;" in r.content.decode()
    assert not ApiToken.objects.exists()


def test_the_row_form_changes_a_tokens_limits_on_the_timeline(user_client):
    token, _ = ApiToken.issue(get_user_model().objects.get(username="ann"), "etl", rpm_limit=10)
    r = user_client.post(f"/tokens/{token.pk}/limits/", {"rpm_limit": "", "tpm_limit": "5000"}, follow=True)
    assert "Saved the limits of token etl" in r.content.decode()
    token.refresh_from_db()
    assert (token.rpm_limit, token.tpm_limit) == (None, 5000)
    event = Event.objects.get(reason="TokenLimitsChanged")
    assert "rpm_limit 10 → none" in event.message and "tpm_limit none → 5000" in event.message
    assert "ann" in event.actor


def test_a_bad_value_comes_back_beside_the_field_and_changes_nothing(user_client):
    token, _ = ApiToken.issue(get_user_model().objects.get(username="ann"), "etl", rpm_limit=10)
    r = user_client.post(f"/tokens/{token.pk}/limits/", {"rpm_limit": "20", "tpm_limit": "0"})
    assert r.status_code == 422
    row = row_of(r.content.decode(), token)
    assert "Not changed: tpm_limit must be a whole number from 1 to" in row
    assert 'class="invalid">tokens' in row and 'value="20"' in row  # what was typed stays
    token.refresh_from_db()
    assert (token.rpm_limit, token.tpm_limit) == (10, None)
    assert not Event.objects.filter(reason="TokenLimitsChanged").exists()


def test_another_persons_token_cannot_be_changed(user_client):
    theirs, _ = ApiToken.issue(get_user_model().objects.create_user("bob"), "bobs")
    r = user_client.post(f"/tokens/{theirs.pk}/limits/", {"rpm_limit": "1", "tpm_limit": ""})
    assert r.status_code == 404 and f"no token {theirs.pk} that you may change" in r.content.decode()
    theirs.refresh_from_db()
    assert theirs.rpm_limit is None
