"""Sign-in tests' fixtures: a user, and a fast password hasher (dozens of sign-ins per test)."""

import pytest
from django.contrib.auth import get_user_model

PASSWORD = "a-long-password"


@pytest.fixture(autouse=True)
def fast_hashing(settings):
    # The production hasher's 1,000,000 rounds would take most of a minute per test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def ann(db):
    return get_user_model().objects.create_user("ann", password=PASSWORD)
