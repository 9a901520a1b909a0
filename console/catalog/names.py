"""The one rule for names that end up in URL paths: models, adapters and deployments (they share it with the
gateway's `model` field and the pages' URLs). Every check goes through here: the API's services, the row
validators (admin, full_clean) and the lookups that answer "no such" without asking the database."""

from __future__ import annotations

import re

from django.core.validators import RegexValidator

from console.errors import Invalid

MAX_NAME = 63
_RULE = r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?"
_WHOLE = re.compile(_RULE)  # used with fullmatch: re's `$` also matches before a trailing newline
WORDS = "use 1-63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit"
# For the OpenAPI document: JSON Schema patterns are ECMA-262, where `$` without the m flag is the very end.
NAME_PATTERN = rf"^{_RULE}$"
# \A and \Z: RegexValidator searches, and `$` would let "ghost\n" through (stored, then unreachable by URL).
NAME_VALIDATOR = RegexValidator(rf"\A{_RULE}\Z", f"{WORDS[:1].upper()}{WORDS[1:]}.")
_ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")


def is_name(value: object) -> bool:
    """Whether `value` is a well-formed name (a lookup of anything else can answer "no such" at once)."""
    return isinstance(value, str) and _WHOLE.fullmatch(value) is not None


def name_problem(value: object) -> str | None:
    """What is wrong with `value` as a name, in words a person can act on; None when nothing is."""
    if is_name(value):
        return None
    if not isinstance(value, str):
        return f"is not a string; {WORDS}"
    if not value:
        return f"is empty; {WORDS}"
    if len(value) > MAX_NAME:
        return f"is {len(value)} characters long, above {MAX_NAME}"
    if value.endswith("\n") and is_name(value[:-1]):
        return f"ends with a newline; {WORDS}"
    bad = next((i for i, c in enumerate(value) if c not in _ALLOWED), None)
    if bad is not None:
        return f"has {value[bad]!r} at position {bad}; {WORDS}"
    return f"must start and end with a letter or digit; {WORDS}"


def validate_name(name: object, what: str, field: str = "name") -> None:
    """Invalid (the API's 422) naming `field` and what is wrong, unless `name` is a well-formed name."""
    problem = name_problem(name)
    if problem is not None:
        raise Invalid(f"{what} name {name!r} is not valid: it {problem}", field=field)
