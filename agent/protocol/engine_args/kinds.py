"""What an engine flag's value may be: a kind per flag, each with the words that say what it takes (shown in a
refusal and in docs/engines.md) and a check that returns the value as the engine will read it.

Every kind takes a strict subset of what vLLM's own parser takes: digits only for numbers (vLLM's `int()` would
also take "+5", "1_000" and, for some flags, "1k"), listed words for choices, absolute paths without `..`, and
JSON objects whose keys and values are listed too. A value that starts with "-" is never one of them, so no value
can be read as a flag.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

_DIGITS = re.compile(r"[0-9]{1,20}")
_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?")


class EngineArgsError(ValueError):
    """Engine arguments a deployment may not set; the message names the argument and what it takes."""


def _bad(flag: str, value: str, takes: str) -> EngineArgsError:
    shown = value if len(value) <= 60 else value[:57] + "..."
    return EngineArgsError(f"engine argument {flag!r} takes {takes}, not {shown!r}")


@dataclass(frozen=True)
class Int:
    """A whole number in [low, high]."""

    low: int
    high: int

    @property
    def takes(self) -> str:
        return f"an integer from {self.low:,} to {self.high:,}"

    def check(self, flag: str, value: str) -> int:
        if not _DIGITS.fullmatch(value) or not self.low <= int(value) <= self.high:
            raise _bad(flag, value, self.takes)
        return int(value)


@dataclass(frozen=True)
class Float:
    """A decimal number in [low, high] (digits and at most one point)."""

    low: float
    high: float

    @property
    def takes(self) -> str:
        return f"a number from {self.low:g} to {self.high:g}"

    def check(self, flag: str, value: str) -> float:
        if not _DECIMAL.fullmatch(value) or not self.low <= float(value) <= self.high:
            raise _bad(flag, value, self.takes)
        return float(value)


@dataclass(frozen=True)
class Choice:
    """One of listed words (or whole numbers written as words)."""

    values: tuple[str, ...]
    what: str = ""  # how a refusal names the list when it is long ("vLLM 0.32's tool-call parsers")

    @property
    def takes(self) -> str:
        return f"one of {', '.join(self.values)}" + (f" ({self.what})" if self.what else "")

    def check(self, flag: str, value: str) -> str:
        if value not in self.values:
            raise _bad(flag, value, self.takes)
        return value


@dataclass(frozen=True)
class ModelDir:
    """A directory given by its absolute path, which must lie inside the model roots (MODELGRID_MODEL_ROOTS). The
    words in `keywords` are taken as they are. The path is only checked for its form here (the protocol reads no
    file system): the console resolves it in its model roots when a deployment is saved."""

    keywords: tuple[str, ...] = ()

    @property
    def takes(self) -> str:
        words = "".join(f"{w!r} or " for w in self.keywords)
        return f"{words}the absolute path of a directory inside the model roots"

    def check(self, flag: str, value: str) -> str:
        if value in self.keywords:
            return value
        if (not value.startswith("/") or ".." in value.split("/") or posixpath.normpath(value) != value
                or value.startswith("//")):
            raise _bad(flag, value, self.takes + " (normalised, without '..')")
        return value


# JSON values inside a JSON-valued flag: each a check that returns a problem or None.
JsonCheck = Callable[[Any], str | None]


@dataclass(frozen=True)
class JBool:
    takes: str = "true or false"

    def __call__(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else self.takes


@dataclass(frozen=True)
class JNumber:
    low: float
    high: float
    integer: bool = False

    @property
    def takes(self) -> str:
        if self.integer:
            return f"an integer from {int(self.low):,} to {int(self.high):,}"
        return f"a number from {self.low:g} to {self.high:g}"

    def __call__(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return self.takes
        if not math.isfinite(value) or not self.low <= value <= self.high:
            return self.takes
        return None


@dataclass(frozen=True)
class JChoice:
    values: tuple[str, ...]
    what: str = ""  # the list in words, where it is long and listed elsewhere

    @property
    def takes(self) -> str:
        return self.what or f"one of {', '.join(map(json.dumps, self.values))}"

    def __call__(self, value: Any) -> str | None:
        return None if isinstance(value, str) and value in self.values else self.takes


@dataclass(frozen=True)
class JsonObject:
    """A JSON object whose keys are listed, each with its kind of value; `rule` checks the keys together (vLLM's
    own rules between them) and returns a problem or None."""

    fields: dict[str, Any]  # key -> JBool | JNumber | JChoice
    rule: Callable[[dict[str, Any]], str | None] | None = field(default=None, compare=False)

    @property
    def takes(self) -> str:
        keys = "; ".join(f"{key!r}: {kind.takes}" for key, kind in self.fields.items())
        return f"a JSON object of these keys only: {keys}"

    def check(self, flag: str, value: str) -> dict[str, Any]:
        try:
            parsed = json.loads(value, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise EngineArgsError(f"engine argument {flag!r} takes a JSON object, and {value[:60]!r} is not valid "
                                  f"JSON ({e})") from None
        if not isinstance(parsed, dict):
            raise EngineArgsError(f"engine argument {flag!r} takes a JSON object, not {value[:60]!r}")
        for key, item in parsed.items():
            kind = self.fields.get(key)
            if kind is None:
                raise EngineArgsError(f"engine argument {flag!r}: key {key!r} is not one a deployment may set (keys "
                                      f"taken: {', '.join(self.fields)})")
            problem = kind(item)
            if problem:
                raise EngineArgsError(f"engine argument {flag!r}: {key!r} takes {problem}, not {json.dumps(item)[:60]}")
        problem = self.rule(parsed) if self.rule is not None else None
        if problem:
            raise EngineArgsError(f"engine argument {flag!r}: {problem}")
        return parsed


def _unique_keys(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


ValueKind = Int | Float | Choice | ModelDir | JsonObject
