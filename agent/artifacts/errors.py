"""The one exception artifact readers raise, and how they quote values taken from a file."""

from __future__ import annotations

from typing import Any

_SHOWN_CHARS = 200


class ArtifactError(ValueError):
    """An artifact that cannot be used; the message names the file and what is wrong."""


def shown(value: Any, limit: int = _SHOWN_CHARS) -> str:
    """`repr(value)` cut to `limit` characters: a hostile file must not make a megabyte error message."""
    if isinstance(value, list | dict) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"  # never repr a huge container
    try:
        text = repr(value)
    except RecursionError:  # pragma: no cover - strict_json refuses deep nesting before this
        return f"<nested {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
