from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from console.accounts.models import ApiToken
from console.fleet.models import AgentCredential

pytestmark = pytest.mark.django_db


def test_only_a_hash_of_the_token_is_stored():
    user = get_user_model().objects.create_user("ann")
    row, token = ApiToken.issue(user)
    stored = ApiToken.objects.filter(pk=row.pk).values().get()
    assert token not in str(stored)
    assert ApiToken.authenticate(token) == row
    assert ApiToken.objects.get().last_used is not None


def test_a_wrong_or_disabled_token_authenticates_nobody():
    user = get_user_model().objects.create_user("ann")
    _, token = ApiToken.issue(user)
    assert ApiToken.authenticate(token[:-1] + ("x" if token[-1] != "x" else "y")) is None
    user.is_active = False
    user.save()
    assert ApiToken.authenticate(token) is None


def test_createapitoken_prints_a_working_token_and_creates_the_user():
    out = StringIO()
    call_command("createapitoken", "robot", stdout=out, stderr=StringIO())
    token = out.getvalue().strip()
    assert ApiToken.authenticate(token).user.username == "robot"
    assert not get_user_model().objects.get(username="robot").has_usable_password()


def test_issuing_an_agent_token_again_revokes_the_old_one():
    _, first = AgentCredential.issue("h1")
    _, second = AgentCredential.issue("h1")
    assert AgentCredential.authenticate(first) is None
    assert AgentCredential.authenticate(second).host_name == "h1"


def test_a_token_is_marked_used_to_the_minute_without_a_write_per_request(django_assert_num_queries):
    from datetime import timedelta

    from django.utils import timezone

    row, token = ApiToken.issue(get_user_model().objects.create_user("ann"))
    ApiToken.authenticate(token)
    first = ApiToken.objects.get().last_used
    with django_assert_num_queries(1):  # the lookup only: used less than a minute ago
        assert ApiToken.authenticate(token) == row
    ApiToken.objects.update(last_used=timezone.now() - timedelta(minutes=2))
    ApiToken.authenticate(token)
    assert ApiToken.objects.get().last_used >= first


# The probe: a secret that holds `_` was shown (and stored) by what follows its last `_`, not by its start.
UNDERSCORED = "ab_cd-efGHIJKLMNOPQRSTUVWXYZ_0123456789abcdefg"


@pytest.mark.parametrize("issue", [lambda: ApiToken.issue(get_user_model().objects.create_user("ann")),
                                   lambda: AgentCredential.issue("gpu-1")])
def test_the_prefix_shown_is_the_start_of_a_secret_that_holds_underscores(monkeypatch, issue):
    monkeypatch.setattr("console.accounts.tokens.secrets.token_urlsafe", lambda n: UNDERSCORED)
    row, token = issue()
    assert row.prefix == "ab_cd-ef" and token.split("_", 2)[2].startswith(row.prefix)
    assert type(row).authenticate(token) == row


@pytest.mark.parametrize("issue", [lambda: ApiToken.issue(get_user_model().objects.create_user("ann")),
                                   lambda: AgentCredential.issue("gpu-1")])
def test_a_token_stored_under_the_old_prefix_rule_still_authenticates_and_is_then_shown_by_its_start(monkeypatch,
                                                                                                       issue):
    from console.accounts.tokens import legacy_prefix

    monkeypatch.setattr("console.accounts.tokens.secrets.token_urlsafe", lambda n: UNDERSCORED)
    row, token = issue()
    type(row).objects.filter(pk=row.pk).update(prefix=legacy_prefix(token))  # as the old rule stored it
    assert type(row).objects.get(pk=row.pk).prefix == "01234567"
    assert type(row).authenticate(token) == row
    assert type(row).objects.get(pk=row.pk).prefix == "ab_cd-ef"
    assert type(row).authenticate(token) == row
