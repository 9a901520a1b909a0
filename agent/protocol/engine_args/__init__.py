"""What a deployment may add to its engine's command line: vLLM flags that tune how it serves (tool-call and
reasoning parsers, prefix caching, batch limits, quantization, ...), each with the values it takes. ModelGrid sets
the model, the names, the address, the key, the memory and LoRA itself, and nothing that imports or runs code from
a file, runs code from the model directory, or loads pickles is passed: the list (agent.protocol.engine_args.vllm)
is what is allowed, keys and values, not what is refused.

Checked by the console when a deployment is saved (which also resolves a path in its model roots) and again by the
agent before it starts vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.protocol.engine_args.kinds import EngineArgsError, ModelDir
from agent.protocol.engine_args.vllm import (
    GONE,
    IMPORTS_CODE,
    MAX_GPUS_PER_REPLICA,
    OPPOSITES,
    PARALLEL_FLAGS,
    SWITCHES,
    VALUED,
)

__all__ = ["MAX_ARG_CHARS", "MAX_ENGINE_ARGS", "EngineArgsError", "EngineSettings", "allowlist_markdown",
           "engine_args_problem", "parse_engine_args"]

MAX_ENGINE_ARGS = 32
MAX_ARG_CHARS = 200
_NOT_TAKEN = ("is not one a deployment may set (ModelGrid sets the model, names, address, key, memory and LoRA "
              "itself; see docs/engines.md for the flags taken)")


@dataclass(frozen=True)
class EngineSettings:
    """Engine arguments as checked: each flag given with its value (True for a switch), and the paths among them
    (flag, path), which the caller checks against its model roots."""

    values: dict[str, Any] = field(default_factory=dict)
    paths: tuple[tuple[str, str], ...] = ()


def parse_engine_args(args: list[str], gpus: int | None = None) -> EngineSettings:
    """`args` checked flag by flag and value by value; EngineArgsError naming the first argument at fault and what
    it takes. With `gpus` (the GPUs one replica spans), tensor x pipeline parallelism must use exactly that many."""
    if len(args) > MAX_ENGINE_ARGS:
        raise EngineArgsError(f"at most {MAX_ENGINE_ARGS} engine arguments are taken, not {len(args)}")
    for i, arg in enumerate(args):
        if not isinstance(arg, str) or not arg or len(arg) > MAX_ARG_CHARS or not arg.isprintable():
            raise EngineArgsError(f"engine argument {i + 1} must be printable text of 1 to {MAX_ARG_CHARS} characters")
    values: dict[str, Any] = {}
    paths = []
    i = 0
    while i < len(args):
        arg = args[i]
        flag, equals, inline = arg.partition("=")
        if flag in SWITCHES and not equals:
            value: Any = True
            i += 1
        elif flag in VALUED:
            if not equals and (i + 1 >= len(args) or args[i + 1].startswith("-")):
                raise EngineArgsError(f"engine argument {arg!r} needs a value: {VALUED[flag].takes}")
            raw = inline if equals else args[i + 1]
            value = VALUED[flag].check(flag, raw)
            if isinstance(VALUED[flag], ModelDir) and value.startswith("/"):
                paths.append((flag, value))
            i += 1 if equals else 2
        else:
            raise EngineArgsError(f"engine argument {arg!r} {_NOT_TAKEN}{_why_not(flag)}")
        if flag in values or OPPOSITES.get(flag) in values:
            raise EngineArgsError(f"engine argument {flag!r} is given twice (or with its opposite); give it once")
        values[flag] = value
    _check_together(values, gpus)
    return EngineSettings(values, tuple(paths))


def _check_together(values: dict[str, Any], gpus: int | None) -> None:
    for switch, needs in SWITCHES.items():
        missing = [n for n in needs if n not in values]
        if switch in values and missing:
            raise EngineArgsError(f"engine argument {switch!r} needs {' and '.join(map(repr, missing))} beside it")
    if any(f in values for f in PARALLEL_FLAGS):
        spans = 1
        for flag in PARALLEL_FLAGS:
            spans *= values.get(flag, 1)
        if gpus is not None and spans != gpus:
            raise EngineArgsError(f"engine arguments {' x '.join(map(repr, PARALLEL_FLAGS))} make {spans} GPUs per "
                                  f"replica; this deployment's replicas have {gpus} (gpus_per_replica): set them "
                                  "to multiply to it")
        if spans > MAX_GPUS_PER_REPLICA:
            raise EngineArgsError(f"engine arguments {' x '.join(map(repr, PARALLEL_FLAGS))} make {spans} GPUs per "
                                  f"replica; a replica spans at most {MAX_GPUS_PER_REPLICA} (one host's)")


def _why_not(flag: str) -> str:
    if flag in IMPORTS_CODE:
        return ": it names a file, module or code that vLLM would load as the agent's user"
    if flag in GONE:
        return ": vLLM 0.32 no longer has it, and its parser refuses it at every start"
    return ""


def engine_args_problem(args: list[str], gpus: int | None = None) -> str | None:
    """Why `args` cannot be passed to vLLM, naming the first argument at fault; None when they all can."""
    try:
        parse_engine_args(args, gpus)
    except EngineArgsError as e:
        return str(e)
    return None


def allowlist_markdown() -> str:
    """The allowlist as docs/engines.md shows it (a test keeps the doc equal to this)."""
    lines = ["| flag | takes |", "| --- | --- |"]
    for switch, needs in SWITCHES.items():
        lines.append(f"| `{switch}` | nothing (a switch){f'; needs `{needs[0]}`' if needs else ''} |")
    for flag, kind in VALUED.items():
        lines.append(f"| `{flag}` | {kind.takes.replace('|', '/')} |")
    return "\n".join(lines)

