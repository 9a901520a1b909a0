"""The Tokens page: a person lists their API tokens, creates one (name, scope, deployments, expiry) and sees its
secret once, and revokes one after confirming; an admin also manages the agents' tokens. Refusals say why and
store nothing."""

import pytest
from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken
from console.fleet.models import AgentCredential

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    get_user_model().objects.create_user("root", password="a-long-password", is_staff=True)
    client.login(username="root", password="a-long-password")
    return client


def test_the_page_needs_a_login(client):
    r = client.get("/tokens/")
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_the_navigation_links_the_page(user_client):
    html = user_client.get("/").content.decode()
    assert '<a href="/tokens/"' in html and ">Tokens</a>" in html


def test_creating_a_token_shows_its_secret_once(user_client):
    r = user_client.post("/tokens/new/", {"name": "ci", "scope": "all", "deployments": "", "expires_in": "7d"})
    assert r.status_code == 200
    row = ApiToken.objects.get(name="ci")
    html = r.content.decode()
    secret = html.split('id="new-secret">', 1)[1].split("<", 1)[0]
    assert ApiToken.authenticate(secret) == row and row.expires is not None
    assert "shown once" in html
    again = user_client.get("/tokens/").content.decode()
    assert secret not in again and f'data-token="{row.pk}"' in again and row.prefix in again


def test_a_refused_token_says_why_names_the_field_and_stores_nothing(user_client):
    r = user_client.post("/tokens/new/", {"name": "ci", "scope": "all", "expires_in": "soon"}, follow=True)
    html = r.content.decode()
    assert "Token not created: expires_in: &#x27;soon&#x27; is not a lifetime" in html
    assert not ApiToken.objects.exists()


def test_a_token_limited_to_deployments_is_made_from_a_comma_separated_list(user_client, model):
    from console.deployments.services import create_deployment

    create_deployment("chat", "tiny", replicas=0)
    create_deployment("embed", "tiny", replicas=0)
    r = user_client.post("/tokens/new/", {"name": "bot", "scope": "inference", "deployments": "chat, embed"})
    assert r.status_code == 200
    assert ApiToken.objects.get(name="bot").deployments == ["chat", "embed"]
    assert "chat, embed" in user_client.get("/tokens/").content.decode()


def test_the_revoke_button_asks_first_and_revokes(user_client):
    user = get_user_model().objects.get(username="ann")
    row, token = ApiToken.issue(user, "ci")
    html = user_client.get("/tokens/").content.decode()
    assert f'action="/tokens/{row.pk}/revoke/"' in html and "return confirm(" in html
    r = user_client.post(f"/tokens/{row.pk}/revoke/", follow=True)
    assert "Token ci revoked" in r.content.decode()
    assert ApiToken.authenticate(token) is None and f'data-token="{row.pk}"' not in r.content.decode()


def test_a_person_sees_and_revokes_only_their_own_tokens(user_client):
    other = get_user_model().objects.create_user("bob")
    theirs, _ = ApiToken.issue(other, "bobs")
    assert f'data-token="{theirs.pk}"' not in user_client.get("/tokens/").content.decode()
    r = user_client.post(f"/tokens/{theirs.pk}/revoke/", follow=True)
    assert "Not revoked: no token" in r.content.decode()
    assert ApiToken.objects.get(pk=theirs.pk).revoked is None


def test_agent_tokens_are_an_admins_only(user_client):
    assert "Agent tokens" not in user_client.get("/tokens/").content.decode()
    r = user_client.post("/tokens/agents/", {"host_name": "gpu-1"}, follow=True)
    assert "only staff" in r.content.decode() and not AgentCredential.objects.exists()


def test_an_admin_issues_and_revokes_an_agent_token(admin_client):
    r = admin_client.post("/tokens/agents/", {"host_name": "gpu-1"})
    html = r.content.decode()
    secret = html.split('id="new-secret">', 1)[1].split("<", 1)[0]
    assert AgentCredential.authenticate(secret).host_name == "gpu-1"
    page = admin_client.get("/tokens/").content.decode()
    assert "Agent tokens" in page and 'data-agent="gpu-1"' in page and secret not in page
    assert 'action="/tokens/agents/gpu-1/revoke/"' in page
    r = admin_client.post("/tokens/agents/gpu-1/revoke/", follow=True)
    assert "Agent token of gpu-1 revoked" in r.content.decode() and not AgentCredential.objects.exists()


def test_an_admin_sees_everyones_tokens_with_their_owner(admin_client):
    ApiToken.issue(get_user_model().objects.create_user("bob"), "bobs")
    html = admin_client.get("/tokens/").content.decode()
    assert "bobs" in html and "<td>bob</td>" in html
