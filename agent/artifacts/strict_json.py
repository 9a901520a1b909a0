"""The one JSON parser for artifact files: refuses what Python's json would accept but no model needs.

`json.loads` happily returns a 5,000-digit integer (then `int()` raises ValueError past 4,300
digits), NaN and Infinity (not JSON at all), 1e999 as infinity, and recurses until RecursionError
on deep nesting. Each of those is an ArtifactError here that names the file and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.limits import MAX_INT_DIGITS, MAX_JSON_DEPTH


@dataclass(frozen=True)
class _Bad:
    """A refused value, carried up to the object holding it so the message can name its field."""

    reason: str
    path: tuple[str, ...] = ()


def _parse_int(text: str) -> int | _Bad:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Bad(f"holds an integer of {digits} digits (at most {MAX_INT_DIGITS} are accepted)")
    return int(text)


def _parse_float(text: str) -> float | _Bad:
    value = float(text)
    if not math.isfinite(value):
        return _Bad(f"holds {text[:40]}, which is out of range (numbers must be finite)")
    return value


def _parse_constant(name: str) -> _Bad:
    return _Bad(f"holds {name}, which is not a JSON number (numbers must be finite)")


def _find_bad(value: Any) -> _Bad | None:
    """A refused value in `value` or in lists nested in it (objects already report their own)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Bad):
            return item
        if isinstance(item, list):
            stack.extend(item)
    return None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Bad:
    for key, value in pairs:
        bad = _find_bad(value)
        if bad is not None:
            return _Bad(bad.reason, (key, *bad.path))
    return dict(pairs)


def loads(data: bytes | str, source: str, what: str = "") -> Any:
    """Parse `data` read from `source`; ArtifactError naming the file, `what` ("header") and the field."""
    subject = f"{source}: {what} is" if what else f"{source}:"
    try:
        value = json.loads(data, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant,
                           object_pairs_hook=_object)
    except RecursionError:
        raise ArtifactError(f"{subject} nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{subject} not valid JSON (not UTF-8: {e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{subject} not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    bad = _find_bad(value)
    if bad is not None:
        field = shown(".".join(bad.path))
        where = f"{source}: {what + ' ' if what else ''}field {field}" if bad.path else f"{source}:"
        raise ArtifactError(f"{where} {bad.reason}")
    if _depth(value) > MAX_JSON_DEPTH:
        raise ArtifactError(f"{subject} nested too deeply (at most {MAX_JSON_DEPTH} levels)")
    return value


def _depth(value: Any) -> int:
    """Nesting depth, walked without recursion (the parser already refused anything deeper than Python's stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # deeper is refused anyway: no need to walk on
                stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
