"""Reading what people type into the pages' forms; a bad value is Invalid, naming the field."""

from __future__ import annotations

from collections.abc import Mapping

from console.errors import Invalid


def whole_number(text: str | None, field: str) -> int | None:
    """An optional whole number: None for empty text."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise Invalid(f"{field} must be a whole number, got {text!r}", field=field) from None


def checked(form: Mapping[str, str], field: str) -> bool:
    """Whether a checkbox was ticked (browsers send "on"; scripts may send true or 1)."""
    return form.get(field) in ("on", "true", "1")
