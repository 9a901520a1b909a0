"""PEFT's regular-expression matching for adapter configs, with bounded work.

An adapter_config.json carries regular expressions: the keys of `rank_pattern` and `alpha_pattern`
and `target_modules` when it is a string. The matching semantics are PEFT's own
(peft/utils/other.py), kept exactly:

* rank_pattern / alpha_pattern, `get_pattern_key`: the first key, in the file's order, for which
  `re.match(rf"(.*\\.)?({key})$", module)` matches; with none, the module name itself is looked up;
* target_modules as a string, `match_target_against_key`: `re.fullmatch(target_modules, module)`;
  "all-linear" is PEFT's shorthand for every linear layer, not a pattern.

What keeps the work bounded:
* a pattern must be valid for Python's `re` (PEFT's engine), and a repeat nested in a repeat
  (`(.*.*)*x`, the probe's pattern) is refused: in `re` it backtracks for hours while holding the
  GIL, so the adapter would freeze any PEFT consumer as it froze the console;
* matching runs on the `regex` package, with a timeout per match and a budget per config;
* `regex` expands counted repeats while compiling, which has no timeout, so patterns whose counted
  repeats multiply past MAX_REPEAT_PRODUCT are refused before they reach its compiler.
"""

from __future__ import annotations

import math
import re
import re._parser as re_parser  # Python's own regex parser: the pattern as PEFT's engine reads it
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import regex

from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.limits import (
    MAX_PATTERN_CHARS,
    MAX_REPEAT_PRODUCT,
    PATTERN_MATCH_SECONDS,
    PATTERN_TOTAL_SECONDS,
)

ALL_LINEAR = "all-linear"  # peft.utils.constants.INCLUDE_LINEAR_LAYERS_SHORTHAND
# A key made only of letters, digits, "_", "." (any character), "\\." (a dot) and a final "$" is a
# fixed-length literal: it is matched without the regex engine (same result, see _LiteralIndex).
_LITERAL = regex.compile(r"(?:[A-Za-z0-9_.]|\\\.)*\$?")
_REPEATS = (re_parser.MAX_REPEAT, re_parser.MIN_REPEAT, re_parser.POSSESSIVE_REPEAT)
# Conservative: any {m}, {m,}, {m,n}, {,n} anywhere counts, even escaped or inside a class.
_COUNTED = regex.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def _repeat_product(pattern: str) -> int:
    return math.prod(max(int(m or 0), int(n or 0), 1) for m, n in _COUNTED.findall(pattern))


def _nests_repeats(tree: re_parser.SubPattern) -> bool:
    """Whether a repeat (max > 1) sits inside another, anywhere in `re`'s parse tree of a pattern."""
    stack = [(tree, False)]
    while stack:
        sub, inside = stack.pop()
        for op, av in sub:
            if op in _REPEATS:
                _, most, body = av
                if most > 1 and inside:
                    return True
                stack.append((body, inside or most > 1))
                continue
            # groups, branches, lookarounds and conditionals hold their parts as SubPatterns (or lists of them)
            for part in av if isinstance(av, list | tuple) else (av,):
                parts = part if isinstance(part, list) else (part,)
                stack.extend((p, inside) for p in parts if isinstance(p, re_parser.SubPattern))
    return False


def _literal(key: str) -> tuple[str, tuple[int, ...]]:
    """A literal key as (the characters it matches, the positions where "." matches any character)."""
    text, wild, i = [], [], 0
    key = key.removesuffix("$")  # "$" before the wrapper's own "$" adds nothing
    while i < len(key):
        if key[i] == "\\":  # only "\\." gets here: a dot
            text.append(".")
            i += 2
            continue
        if key[i] == ".":
            wild.append(len(text))
        text.append(key[i])
        i += 1
    return "".join(text), tuple(wild)


class _LiteralIndex:
    """The keys of one pattern dict in file order, literal ones grouped for matching in a few lookups.

    For a literal key PEFT's `(.*\\.)?(key)$` matches exactly when the module's last n characters
    (n: the characters the key matches) start the name or follow a ".", and equal the key's wherever
    the key has no wildcard ".". Keys of one length and one set of wildcard positions form a group:
    the module's tail, with those positions blanked to ".", is looked up in the group's dict. Rank
    patterns listing every module (PEFT's EVA writes those) then cost a few dict lookups per module
    instead of one regular expression per key.
    """

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.others: list[tuple[int, str]] = []  # (order, key) of keys that need the regex engine
        self.groups: dict[tuple[int, tuple[int, ...]], dict[str, int]] = {}
        for order, key in enumerate(keys):
            if _LITERAL.fullmatch(key):
                text, wild = _literal(key)
                self.groups.setdefault((len(text), wild), {}).setdefault(text, order)
            else:
                self.others.append((order, key))

    def first(self, module: str) -> int | None:
        """The order of the first literal key matching `module` (which holds no newline), or None."""
        best = None
        for (n, dots), table in self.groups.items():
            if len(module) < n or (len(module) > n and module[-n - 1] != "."):
                continue
            tail = module[len(module) - n:]
            if dots:
                chars = list(tail)
                for i in dots:
                    chars[i] = "."
                tail = "".join(chars)
            order = table.get(tail)
            if order is not None and (best is None or order < best):
                best = order
        return best


class PatternMatcher:
    """Evaluates one adapter config's patterns; all of its work together stays within `budget` seconds.

    Only time spent on patterns counts (compiling, matching, the literal fast path), not reading
    files. Every error names the file and the field.
    """

    def __init__(self, source: str, budget: float = PATTERN_TOTAL_SECONDS) -> None:
        self.source = source
        self._budget = budget
        self._spent = 0.0
        self._deadline = 0.0  # set while a public method runs
        self._compiled: dict[tuple[str, str], Any] = {}
        self._indexes: dict[str, tuple[dict[str, Any], _LiteralIndex]] = {}

    @contextmanager
    def _timed(self) -> Iterator[None]:
        began = time.monotonic()
        self._deadline = began + self._budget - self._spent
        try:
            yield
        finally:
            self._spent += time.monotonic() - began

    def check_pattern_keys(self, field: str, patterns: dict[str, Any]) -> None:
        """Compile every key of rank_pattern/alpha_pattern now, so a bad one is refused at registration."""
        with self._timed():
            for key in patterns:
                self._check_length(field, key)
                if not _LITERAL.fullmatch(key):
                    self._compile(field, key, rf"(.*\.)?({key})$")

    def check_target_pattern(self, pattern: str) -> None:
        if pattern != ALL_LINEAR:
            with self._timed():
                self._compile("target_modules", pattern, pattern)

    def pattern_value(self, field: str, patterns: dict[str, Any], module: str, default: Any) -> Any:
        """The value of the first key matching the end of `module`, exactly as PEFT resolves rank_pattern."""
        with self._timed():
            self._remaining(field)
            index = self._index(field, patterns)
            if "\n" in module:  # the literal shortcut assumes none ("." does not match it): all keys by regex
                first, candidates = None, list(enumerate(index.keys))
            else:
                first, candidates = index.first(module), index.others  # first: the earliest literal key matching
            for order, key in candidates:
                if first is not None and order > first:
                    break
                compiled = self._compile(field, key, rf"(.*\.)?({key})$")
                if self._run(field, key, partial(compiled.match, module, concurrent=True)):
                    return patterns[key]
            if first is not None:
                return patterns[index.keys[first]]
        return patterns.get(module, default)  # get_pattern_key's fallback: the module name itself

    def targets(self, pattern: str, module: str) -> bool:
        """Whether target_modules given as one pattern selects `module` (re.fullmatch, as PEFT)."""
        if pattern == ALL_LINEAR:
            return True
        with self._timed():
            compiled = self._compile("target_modules", pattern, pattern)
            return self._run("target_modules", pattern, partial(compiled.fullmatch, module, concurrent=True))

    def _index(self, field: str, patterns: dict[str, Any]) -> _LiteralIndex:
        cached = self._indexes.get(field)
        if cached is None or cached[0] is not patterns:
            cached = self._indexes[field] = (patterns, _LiteralIndex(list(patterns)))
        return cached[1]

    def _compile(self, field: str, key: str, pattern: str) -> Any:
        cached = self._compiled.get((field, key))
        if cached is not None:
            return cached
        self._check_length(field, key)
        where = f"{self.source}: {field} pattern {shown(key)}"
        self._remaining(field)
        try:
            re.compile(pattern)  # PEFT's own engine decides what is a valid pattern
            tree = re_parser.parse(pattern)
        except (re.error, OverflowError, RecursionError, ValueError, IndexError) as e:
            # re.error for ordinary mistakes; deep nesting and some malformed input raise the others
            raise ArtifactError(f"{where} is not a valid regular expression ({e})") from None
        if _nests_repeats(tree):
            raise ArtifactError(f"{where} repeats inside a repeat (like (a*)*); PEFT matches with Python's re, "
                                "where that can backtrack for hours, so such patterns are refused")
        repeats = _repeat_product(key)
        if repeats > MAX_REPEAT_PRODUCT:
            raise ArtifactError(f"{where} repeats too much: its counted repeats ({{m,n}}) multiply to {repeats:,} "
                                f"(at most {MAX_REPEAT_PRODUCT:,}), more than the regex compiler expands quickly")
        try:
            compiled = regex.compile(pattern)
        except (regex.error, OverflowError, RecursionError, ValueError, IndexError) as e:
            raise ArtifactError(f"{where} is not a valid regular expression ({e})") from None
        self._compiled[(field, key)] = compiled
        return compiled

    def _check_length(self, field: str, key: str) -> None:
        if len(key) > MAX_PATTERN_CHARS:
            raise ArtifactError(f"{self.source}: {field} pattern {shown(key)} is {len(key):,} characters long "
                                f"(at most {MAX_PATTERN_CHARS} are accepted)")

    def _run(self, field: str, key: str, match: Callable[..., Any]) -> bool:
        """`match(timeout=...)` within this pattern's limit and what is left of the budget."""
        timeout = min(PATTERN_MATCH_SECONDS, self._remaining(field))
        try:
            return match(timeout=timeout) is not None
        except TimeoutError:
            self._remaining(field)  # the whole budget ran out rather than this pattern's own limit
            raise ArtifactError(f"{self.source}: {field} pattern {shown(key)} takes too long to match a module name "
                                f"(more than {PATTERN_MATCH_SECONDS:g} s); simplify the pattern") from None

    def _remaining(self, field: str) -> float:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise ArtifactError(f"{self.source}: {field} patterns take too long to match the adapter's modules "
                                f"(more than {self._budget:g} s in all); simplify or shorten the patterns")
        return remaining
