"""Reading a token's expiry as people and scripts write it: a lifetime (`30d`, `12h`, seconds) or a moment
(ISO 8601 with a time zone); every refusal names the field and what is accepted."""

from datetime import UTC, datetime, timedelta

import pytest

from console.accounts.expiry import expiry, parse_lifetime
from console.errors import Invalid

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30d", 30 * 86400), ("12h", 12 * 3600), ("90m", 5400), ("2w", 14 * 86400), ("3600", 3600), (" 7D ", 7 * 86400),
    (3600, 3600), ("120s", 120),
])
def test_a_lifetime_reads_as_a_number_and_a_unit(text, seconds):
    assert parse_lifetime(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(("value", "words"), [
    ("soon", "'soon' is not a lifetime"), ("", "is empty"), ("0", "at least 1 minute"), (-5, "at least 1 minute"),
    ("30s", "at least 1 minute"), ("4000d", "at most 3650 days"), (10**30, "at most 3650 days"),
    ("1.5d", "is not a lifetime"), (True, "is not a lifetime"),
])
def test_a_bad_lifetime_is_invalid_naming_the_field(value, words):
    with pytest.raises(Invalid) as e:
        parse_lifetime(value)
    assert e.value.field == "expires_in" and words in str(e.value)
    assert "30d" in str(e.value) or "at " in str(e.value)


def test_expiry_is_now_plus_the_lifetime_or_the_moment_given_or_never():
    assert expiry("1d", None, NOW) == NOW + timedelta(days=1)
    assert expiry(None, "2027-01-01T00:00:00Z", NOW) == datetime(2027, 1, 1, tzinfo=UTC)
    assert expiry(None, "2027-01-01T01:00:00+01:00", NOW) == datetime(2027, 1, 1, tzinfo=UTC)
    assert expiry(None, None, NOW) is None


@pytest.mark.parametrize(("expires", "words"), [
    ("tomorrow", "'tomorrow' is not an ISO 8601 date and time"),
    ("2027-01-01T00:00:00", "has no time zone"),
    ("2026-11-30T00:00:00Z", "is not in the future"),
    ("2046-12-01T00:00:00Z", "at most 3650 days"),
])
def test_a_bad_moment_is_invalid_naming_the_field(expires, words):
    with pytest.raises(Invalid) as e:
        expiry(None, expires, NOW)
    assert e.value.field == "expires" and words in str(e.value)


def test_a_lifetime_and_a_moment_together_are_refused():
    with pytest.raises(Invalid) as e:
        expiry("1d", "2027-01-01T00:00:00Z", NOW)
    assert e.value.field == "expires_in" and "not both" in str(e.value)
