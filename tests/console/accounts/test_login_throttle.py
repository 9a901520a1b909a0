"""Sign-in throttling: after too many wrong passwords for one username from one address that pair is locked
out for a cool-off window (the right password included), the login page says so and for how long, and
nobody else is locked out: other users, other addresses, API tokens and open sessions keep working."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from console.accounts.models import ApiToken
from tests.console.accounts.conftest import PASSWORD

pytestmark = pytest.mark.django_db
LOCKED = "Too many failed sign-ins"


def sign_in(username: str, password: str, address: str = "10.0.0.1", url: str = "/accounts/login/"):
    client = Client(REMOTE_ADDR=address)
    response = client.post(url, {"username": username, "password": password})
    return response, client


def fail(times: int, username: str = "ann", address: str = "10.0.0.1") -> None:
    for _ in range(times):
        response, _ = sign_in(username, "wrong-password", address)
        assert response.status_code in (200, 429)


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_the_defaults_are_ten_failures_and_a_fifteen_minute_cool_off():
    assert settings.AXES_FAILURE_LIMIT == 10
    assert settings.AXES_COOLOFF_TIME == timedelta(minutes=15)


def test_a_wrong_password_is_still_just_a_wrong_password(ann):
    response, client = sign_in("ann", "wrong-password")
    assert response.status_code == 200
    assert "did not match" in response.content.decode() and LOCKED not in response.content.decode()
    assert not signed_in(client)


def test_after_ten_wrong_passwords_even_the_right_one_is_refused(ann):
    fail(settings.AXES_FAILURE_LIMIT)
    response, client = sign_in("ann", PASSWORD)
    assert response.status_code == 429
    assert not signed_in(client)


def test_the_login_page_says_the_sign_in_is_locked_and_for_how_long(ann):
    fail(settings.AXES_FAILURE_LIMIT)
    response, _ = sign_in("ann", PASSWORD)
    html = response.content.decode()
    assert LOCKED in html and "try again in 15 minutes" in html
    assert '<form method="post"' in html  # still the login page, not a bare error


def test_a_lockout_locks_only_that_username_from_that_address(ann):
    get_user_model().objects.create_user("bob", password=PASSWORD)
    fail(settings.AXES_FAILURE_LIMIT)
    assert sign_in("ann", PASSWORD)[0].status_code == 429
    response, client = sign_in("bob", PASSWORD)  # another user, same address
    assert response.status_code == 302 and signed_in(client)
    response, client = sign_in("ann", PASSWORD, address="10.0.0.2")  # same user, another address
    assert response.status_code == 302 and signed_in(client)


def test_a_lockout_leaves_api_tokens_and_open_sessions_working(ann):
    token = ApiToken.issue(ann)[1]
    session = Client()
    session.force_login(ann)
    fail(settings.AXES_FAILURE_LIMIT)
    assert sign_in("ann", PASSWORD)[0].status_code == 429
    assert Client().get("/api/v1/hosts", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    assert session.get("/").status_code == 200


def test_the_lockout_ends_after_the_cool_off(ann):
    fail(settings.AXES_FAILURE_LIMIT)
    assert sign_in("ann", PASSWORD)[0].status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    response, client = sign_in("ann", PASSWORD)
    assert response.status_code == 302 and signed_in(client)


def test_a_successful_sign_in_starts_the_count_again(ann):
    for _ in range(2):
        fail(settings.AXES_FAILURE_LIMIT - 1)
        response, client = sign_in("ann", PASSWORD)
        assert response.status_code == 302 and signed_in(client)


def test_the_admin_login_is_throttled_too():
    get_user_model().objects.create_superuser("root", "", PASSWORD)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        sign_in("root", "wrong-password", url="/admin/login/")
    response, client = sign_in("root", PASSWORD, url="/admin/login/")
    assert response.status_code == 429 and LOCKED in response.content.decode()
    assert not signed_in(client)


def test_the_test_clients_login_still_works_without_a_request(ann):
    # Programmatic sign-ins (no HTTP request: tests, shells) are not network attempts to throttle.
    assert Client().login(username="ann", password=PASSWORD)
    assert not Client().login(username="ann", password="wrong-password")
