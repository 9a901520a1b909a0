"""What a deployment may add to its engine's command line: flags that tune how it serves, each with the values it
takes. ModelGrid sets the model, the names, the address, the key, the memory and LoRA itself, and nothing that
imports or runs code from a file, runs code from the model directory, or loads pickles is passed: an engine's
Allowlist (agent.engines.<name>.settings) is what is allowed, keys and values, not what is refused.

Checked by the console when a deployment is saved (which also resolves a path in its model roots) and again by the
agent before it starts the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.protocol.engine_args.kinds import EngineArgsError, ModelDir, ValueKind

__all__ = ["MAX_ARG_CHARS", "MAX_ENGINE_ARGS", "Allowlist", "EngineArgsError", "EngineSettings", "parse_engine_args"]

MAX_ENGINE_ARGS = 32
MAX_ARG_CHARS = 200
_NOT_TAKEN = ("is not one a deployment may set (ModelGrid sets the model, names, address, key, memory and LoRA "
              "itself; see docs/engines.md for the flags taken)")


@dataclass(frozen=True)
class Allowlist:
    """One engine's flags: switches (each with the flags it needs beside it), flags with a value and its kind, flags
    refused with a reason of their own, flags whose product is the GPUs one replica spans (at most max_gpus)."""

    switches: dict[str, tuple[str, ...]]
    valued: dict[str, ValueKind]
    refused: dict[str, str] = field(default_factory=dict)
    parallel_flags: tuple[str, ...] = ()
    max_gpus: int = 1

    @property
    def opposites(self) -> dict[str, str]:
        """A switch and its --no- form set one thing: one of them at most (each maps to the other)."""
        pairs = {name: "--no-" + name[2:] for name in self.switches if "--no-" + name[2:] in self.switches}
        return pairs | {off: on for on, off in pairs.items()}

    def markdown(self) -> str:
        """The allowlist as docs/engines.md shows it (a test keeps the doc equal to this)."""
        lines = ["| flag | takes |", "| --- | --- |"]
        for switch, needs in self.switches.items():
            lines.append(f"| `{switch}` | nothing (a switch){f'; needs `{needs[0]}`' if needs else ''} |")
        for flag, kind in self.valued.items():
            lines.append(f"| `{flag}` | {kind.takes.replace('|', '/')} |")
        return "\n".join(lines)


@dataclass(frozen=True)
class EngineSettings:
    """Engine arguments as checked: each flag given with its value (True for a switch), and the paths among them
    (flag, path), which the caller checks against its model roots."""

    values: dict[str, Any] = field(default_factory=dict)
    paths: tuple[tuple[str, str], ...] = ()


def parse_engine_args(args: list[str], allowed: Allowlist, gpus: int | None = None) -> EngineSettings:
    """`args` checked flag by flag and value by value; EngineArgsError naming the first argument at fault and what
    it takes. With `gpus` (the GPUs one replica spans), tensor x pipeline parallelism must use exactly that many."""
    if len(args) > MAX_ENGINE_ARGS:
        raise EngineArgsError(f"at most {MAX_ENGINE_ARGS} engine arguments are taken, not {len(args)}")
    for i, arg in enumerate(args):
        if not isinstance(arg, str) or not arg or len(arg) > MAX_ARG_CHARS or not arg.isprintable():
            raise EngineArgsError(f"engine argument {i + 1} must be printable text of 1 to {MAX_ARG_CHARS} characters")
    values: dict[str, Any] = {}
    paths = []
    switches, valued, opposites = allowed.switches, allowed.valued, allowed.opposites
    i = 0
    while i < len(args):
        arg = args[i]
        flag, equals, inline = arg.partition("=")
        if flag in switches and not equals:
            value: Any = True
            i += 1
        elif flag in valued:
            if not equals and (i + 1 >= len(args) or args[i + 1].startswith("-")):
                raise EngineArgsError(f"engine argument {arg!r} needs a value: {valued[flag].takes}")
            raw = inline if equals else args[i + 1]
            value = valued[flag].check(flag, raw)
            if isinstance(valued[flag], ModelDir) and value.startswith("/"):
                paths.append((flag, value))
            i += 1 if equals else 2
        else:
            why = f": {allowed.refused[flag]}" if flag in allowed.refused else ""
            raise EngineArgsError(f"engine argument {arg!r} {_NOT_TAKEN}{why}")
        if flag in values or opposites.get(flag) in values:
            raise EngineArgsError(f"engine argument {flag!r} is given twice (or with its opposite); give it once")
        values[flag] = value
    _check_together(values, allowed, gpus)
    return EngineSettings(values, tuple(paths))


def _check_together(values: dict[str, Any], allowed: Allowlist, gpus: int | None) -> None:
    for switch, needs in allowed.switches.items():
        missing = [n for n in needs if n not in values]
        if switch in values and missing:
            raise EngineArgsError(f"engine argument {switch!r} needs {' and '.join(map(repr, missing))} beside it")
    parallel = allowed.parallel_flags
    if any(f in values for f in parallel):
        spans = 1
        for flag in parallel:
            spans *= values.get(flag, 1)
        if gpus is not None and spans != gpus:
            raise EngineArgsError(f"engine arguments {' x '.join(map(repr, parallel))} make {spans} GPUs per "
                                  f"replica; this deployment's replicas have {gpus} (gpus_per_replica): set them "
                                  "to multiply to it")
        if spans > allowed.max_gpus:
            raise EngineArgsError(f"engine arguments {' x '.join(map(repr, parallel))} make {spans} GPUs per "
                                  f"replica; a replica spans at most {allowed.max_gpus} (one host's)")
