"""What a failed sign-in leaves in the database is bounded: each attempt stores a short excerpt of its request,
and the row that counts one username's failures from one address keeps only the latest, however many come."""

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client

from console.accounts.throttle import STORED_CHARS

pytestmark = pytest.mark.django_db
JUNK = "x" * 10_000


@pytest.fixture(autouse=True)
def fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def fail(client: Client, n: int) -> None:
    for i in range(n):
        response = client.post(f"/accounts/login/?n={i}&junk={JUNK}", {"username": "ann", "password": "wrong",
                                                                        "filler": JUNK, "n": i},
                               HTTP_ACCEPT="text/html;" + JUNK)
        assert response.status_code in (200, 429)


def test_repeated_failed_sign_ins_keep_one_row_of_bounded_size():
    get_user_model().objects.create_user("ann", password="a-long-password")
    client = Client(REMOTE_ADDR="10.0.0.1", HTTP_USER_AGENT="probe")
    fail(client, 30)
    (row,) = AccessAttempt.objects.all()
    assert row.failures_since_start == 30
    assert len(row.get_data) <= STORED_CHARS and len(row.post_data) <= STORED_CHARS
    assert len(row.http_accept) <= STORED_CHARS
    assert "n=29" in row.get_data  # the latest attempt's, not the first's


def test_an_attempt_stores_an_excerpt_with_the_password_masked():
    client = Client(REMOTE_ADDR="10.0.0.2")
    client.post("/accounts/login/", {"username": "bob", "password": "hunter2-secret"})
    (row,) = AccessAttempt.objects.all()
    assert "hunter2" not in row.post_data and "password=" in row.post_data
    fail(client, 1)
    row.refresh_from_db()
    assert 0 < len(row.post_data) <= STORED_CHARS and len(row.get_data) <= STORED_CHARS
