"""When API tokens stop working: an expiry read as people and scripts write it (a lifetime such as `30d`, or an ISO
8601 moment with its time zone), and the words that tell a client why its token is refused."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from console.errors import Invalid

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MIN_LIFETIME = timedelta(minutes=1)
MAX_LIFETIME = timedelta(days=3650)
LIFETIME_FORM = "a whole number of seconds, or a number with a unit: 90m, 12h, 30d, 2w"
_LIFETIME = re.compile(r"([0-9]{1,12})([smhdw]?)")


def parse_lifetime(value: int | str, field: str = "expires_in") -> timedelta:
    """How long a token lives: seconds (a JSON integer or digits) or `N` + s, m, h, d or w; 1 minute to 10 years."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise Invalid(f"{field}: {value!r} is not a lifetime; give {LIFETIME_FORM}", field=field)
    if isinstance(value, int):
        seconds = value
    else:
        text = value.strip().lower()
        if not text:
            raise Invalid(f"{field} is empty; give {LIFETIME_FORM}, or leave it out for a token that never expires",
                          field=field)
        match = _LIFETIME.fullmatch(text)
        if match is None:
            raise Invalid(f"{field}: {value[:40]!r} is not a lifetime; give {LIFETIME_FORM}", field=field)
        seconds = int(match.group(1)) * UNITS[match.group(2) or "s"]
    if seconds < MIN_LIFETIME.total_seconds():
        raise Invalid(f"{field}: a token must live at least 1 minute, got {seconds} seconds", field=field)
    if seconds > MAX_LIFETIME.total_seconds():
        raise Invalid(f"{field}: a token may live at most {MAX_LIFETIME.days} days", field=field)
    return timedelta(seconds=seconds)


def parse_moment(text: str, now: datetime, field: str = "expires") -> datetime:
    """An ISO 8601 date and time with a time zone, in the future and at most MAX_LIFETIME away."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Invalid(f"{field}: {text[:40]!r} is not an ISO 8601 date and time (2027-01-31T18:00:00Z)",
                      field=field) from None
    if when.tzinfo is None:
        raise Invalid(f"{field}: {text[:40]!r} has no time zone; end it with Z (UTC) or an offset such as +01:00",
                      field=field)
    if when <= now:
        raise Invalid(f"{field}: {stamp(when)} is not in the future (it is {stamp(now)})", field=field)
    if when - now > MAX_LIFETIME:
        raise Invalid(f"{field}: a token may live at most {MAX_LIFETIME.days} days", field=field)
    return when.astimezone(UTC)


def expiry(expires_in: int | str | None, expires: str | None, now: datetime) -> datetime | None:
    """When a token made now expires: `expires_in` after now, at `expires`, or never (neither given)."""
    if expires_in is not None and expires is not None:
        raise Invalid("expires_in and expires: give one of them, not both", field="expires_in")
    if expires_in is not None:
        return now + parse_lifetime(expires_in)
    if expires is not None:
        return parse_moment(expires, now)
    return None


def stamp(when: datetime) -> str:
    """A moment as the API and the refusals write it: UTC, to the second (2027-01-31T18:00:00Z)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ANOTHER = "make a new one on the console's Tokens page or with POST /api/v1/tokens"


def expired(label: str, when: datetime) -> str:
    return f"token expired at {stamp(when)} ({label}); {ANOTHER}"


def revoked(label: str, when: datetime) -> str:
    return f"token revoked at {stamp(when)} ({label}); {ANOTHER}"
