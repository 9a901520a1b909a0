"""What one request may ask of an engine, checked before it reaches one, for both engines: the one owner of these
bounds. A body over a bound is refused with a 400 that names the field and the bound.

- Choices per prompt (`n`, `best_of`) and log probabilities per token (`logprobs`, `top_logprobs`,
  `prompt_logprobs`): vLLM holds a replica for the whole batch (`n: 10000` held one 17 s), and -1 asks it for
  the whole vocabulary.
- Structured outputs, in every spelling vLLM has had (`structured_outputs`, the older `guided_*` fields,
  `response_format`, the Responses API's `text.format`, and tool schemas, which `tool_choice` compiles): the count
  and length of choices, a schema's nesting and size, the length of regexes and grammars, and their counted
  repetitions. A grammar's compile time grows with each counted repetition (`{m,n}`, a string's
  minLength/maxLength, an array's minItems/maxItems) up to about 64 copies, times the vocabulary, and nested ones
  add up; a format or a number range compiles a small regex of its own. So they are weighed (a repetition by its
  count up to 64, a format or range by 1) and the weights summed per request. The measured figures behind these
  bounds are in docs/engines.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agent.serving.dispatch import BadInput

MAX_N = 16  # n and best_of: sequences generated per prompt
MAX_LOGPROBS = 20  # logprobs, top_logprobs, prompt_logprobs: alternatives per token (OpenAI's top_logprobs cap)
MAX_CHOICES = 1024  # a structured choice's alternatives
MAX_CHOICE_CHARS = 65_536  # their total length
MAX_SCHEMA_DEPTH = 32  # JSON nesting of a schema (a schema level is two: "properties", then the property)
MAX_SCHEMA_VALUES = 8192  # JSON values in all of a request's schemas (tools included)
MAX_SCHEMA_CHARS = 262_144  # a schema given as a JSON string, before it is parsed
MAX_PATTERN_CHARS = 16_384  # regexes, grammars, structural tags and schema patterns, in all
MAX_REPEAT_WEIGHT = 128  # counted repetitions in all, each weighing its count up to REPEAT_CAP
REPEAT_CAP = 64  # past this many copies, a repetition costs xgrammar no more to compile
MAX_TOOLS = 128  # as OpenAI takes

COUNTED_FIELDS = ("n", "best_of")
LOGPROB_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs")
# A schema's counted repetitions: each pair bounds one repetition.
REPEAT_KEYWORDS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
# Keywords a backend compiles into a small regex of their own (a format's, a number range's): each weighs 1.
REGEX_KEYWORDS = ("format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# Keys whose text a backend compiles as a regex or grammar, wherever they appear (schemas, structural tags).
PATTERN_KEYS = ("pattern", "regex", "grammar", "ebnf", "lark")
_QUANTIFIER = re.compile(r"(?<!\\)\{\s*(\d{1,9})\s*(?:,\s*(\d{0,9})\s*)?\}")


def check_request(body: dict[str, Any]) -> None:
    """BadInput (400) naming the field and its bound when `body` asks an engine for more than one request may."""
    for name in COUNTED_FIELDS:
        value = _number(body.get(name))
        if value is not None and value > MAX_N:
            raise BadInput(f"'{name}' is {body[name]}; a request may ask for at most {MAX_N} sequences per prompt",
                           param=name)
    for name in LOGPROB_FIELDS:
        value = _number(body.get(name))
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise BadInput(f"'{name}' is {body[name]}; it must be from 0 to {MAX_LOGPROBS} (log probabilities per "
                           "token)", param=name)
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise BadInput(f"'tools' lists {len(tools)} tools; at most {MAX_TOOLS} are taken", param="tools")
    budget = _Budget()
    for param, kind, value in _constraints(body):
        if kind == "choice":
            _check_choice(param, value)
        elif kind == "text":
            budget.text(param, value)
        else:
            budget.schema(param, value)


def _constraints(body: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(field, kind, value) for everything in `body` an engine would compile into a grammar."""
    outputs = body.get("structured_outputs")
    given = [(f"structured_outputs.{k}", v) for k, v in outputs.items()] if isinstance(outputs, dict) else []
    given += [(k, v) for k, v in body.items() if k.startswith("guided_")]
    for param, value in given:
        key = param.rpartition(".")[2].removeprefix("guided_")
        if value is None:
            continue
        if key == "choice":
            yield param, "choice", value
        elif key in ("json", "structural_tag"):  # a structural tag is a JSON text of schemas and patterns
            yield param, "schema", value
        elif isinstance(value, str) and key in ("regex", "grammar", "whitespace_pattern"):
            yield param, "text", value
    if body.get("response_format") is not None:
        yield "response_format", "schema", body["response_format"]
    text = body.get("text")
    if isinstance(text, dict) and text.get("format") is not None:
        yield "text.format", "schema", text["format"]
    if body.get("tools") is not None:
        yield "tools", "schema", body["tools"]


def _check_choice(param: str, choices: Any) -> None:
    if not isinstance(choices, list):
        return  # not a list: the engine refuses it
    if len(choices) > MAX_CHOICES:
        raise BadInput(f"'{param}' has {len(choices):,} choices; at most {MAX_CHOICES:,} are taken", param=param)
    chars = sum(len(c) if isinstance(c, str) else len(json.dumps(c)) for c in choices)
    if chars > MAX_CHOICE_CHARS:
        raise BadInput(f"'{param}' is {chars:,} characters in all; at most {MAX_CHOICE_CHARS:,} are taken",
                       param=param)


@dataclass
class _Budget:
    """What a request's constraints add up to so far: schema values, pattern text, counted repetitions."""

    values: int = 0
    chars: int = 0
    weight: int = 0

    def text(self, param: str, text: str) -> None:
        self.chars += len(text)
        if self.chars > MAX_PATTERN_CHARS:
            raise BadInput(f"'{param}': regexes, grammars and patterns may be {MAX_PATTERN_CHARS:,} characters in all "
                           "per request", param=param)
        for low, high in _QUANTIFIER.findall(text):
            self.repeat(param, int(low), int(high) if high else None)

    def repeat(self, param: str, low: int, high: int | None) -> None:
        self.weight += min(max(low, high or 0), REPEAT_CAP)
        if self.weight > MAX_REPEAT_WEIGHT:
            raise BadInput(f"'{param}': counted repetitions ({{m,n}} in a pattern, a schema's minLength/maxLength, "
                           f"minItems/maxItems, minProperties/maxProperties: each weighs its count, at most "
                           f"{REPEAT_CAP}) and formats and number ranges (1 each) weigh more than "
                           f"{MAX_REPEAT_WEIGHT} per request: each makes the grammar's compile slower", param=param)

    def schema(self, param: str, schema: Any) -> None:
        if isinstance(schema, str):
            if len(schema) > MAX_SCHEMA_CHARS:
                raise BadInput(f"'{param}' is {len(schema):,} characters; a schema may be {MAX_SCHEMA_CHARS:,}",
                               param=param)
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError):
                self.text(param, schema)  # not JSON (the engine refuses it), or a spelling it reads otherwise
                return
        level = [schema]
        depth = 0
        while level:  # a level at a time, no recursion: depth and size are both bounded as it goes
            depth += 1
            if depth > MAX_SCHEMA_DEPTH:
                raise BadInput(f"'{param}' nests more than {MAX_SCHEMA_DEPTH} levels deep (JSON objects and arrays)",
                               param=param)
            inner: list[Any] = []
            for node in level:
                self._count(param, 1)
                if isinstance(node, dict):
                    self._keywords(param, node)
                    inner += node.values()
                elif isinstance(node, list):
                    inner += node
            level = inner

    def _count(self, param: str, values: int) -> None:
        self.values += values
        if self.values > MAX_SCHEMA_VALUES:
            raise BadInput(f"'{param}': schemas may hold {MAX_SCHEMA_VALUES:,} JSON values in all per request",
                           param=param)

    def _keywords(self, param: str, node: dict[str, Any]) -> None:
        for low_key, high_key in REPEAT_KEYWORDS:
            low, high = _number(node.get(low_key)), _number(node.get(high_key))
            if low is not None or high is not None:
                self.repeat(param, _whole(low or 0), None if high is None else _whole(high))
        if any(key in node and not isinstance(node[key], dict | list) for key in REGEX_KEYWORDS):
            self.repeat(param, 1, None)
        for key in PATTERN_KEYS:
            if isinstance(node.get(key), str):
                self.text(param, node[key])
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict):
            for pattern in patterns:
                self.text(param, pattern)


def _number(value: Any) -> float | None:
    """`value` as the number an engine's lax parser would read (a JSON number, or a string of one); None if none.
    Infinity is a number here (past every bound); NaN is none (no engine reads it as a count)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and len(value) <= 40:
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and value == value:
        return value
    return None


def _whole(value: float) -> int:
    return int(max(0, min(value, 1e9)))


def bounds_markdown() -> str:
    """The bounds as docs/engines.md shows them (a test keeps the doc equal to this)."""
    rows = [
        ("`n`, `best_of`", f"at most {MAX_N} sequences per prompt"),
        ("`logprobs`, `top_logprobs`, `prompt_logprobs`", f"0 to {MAX_LOGPROBS} per token (a number; chat's "
                                                          "`logprobs` switch is not one)"),
        ("`structured_outputs.choice`, `guided_choice`", f"at most {MAX_CHOICES:,} choices, {MAX_CHOICE_CHARS:,} "
                                                         "characters in all"),
        ("schemas: `structured_outputs.json`, `guided_json`, `response_format`, `text.format`, `tools`, and "
         "`structured_outputs.structural_tag` (JSON text of schemas)",
         f"at most {MAX_SCHEMA_DEPTH} levels of JSON nesting each, {MAX_SCHEMA_VALUES:,} JSON values in all; a schema "
         f"sent as a string at most {MAX_SCHEMA_CHARS:,} characters"),
        ("`structured_outputs.regex`/`grammar`/`whitespace_pattern`, `guided_regex`, "
         "`guided_grammar`, `guided_whitespace_pattern`, and a schema's `pattern`s",
         f"{MAX_PATTERN_CHARS:,} characters in all"),
        ("counted repetitions: `{m,n}` in any of those, a schema's `minLength`/`maxLength`, `minItems`/`maxItems`, "
         "`minProperties`/`maxProperties`; and a schema's `format`s and number ranges (`minimum`, `maximum`, ...)",
         f"a weight of {MAX_REPEAT_WEIGHT} in all: a repetition weighs its count up to {REPEAT_CAP}, a format or "
         "range 1"),
        ("`tools`", f"at most {MAX_TOOLS}"),
    ]
    return "\n".join(["| what a request sends | bound |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in rows)])
