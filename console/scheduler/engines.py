"""Engines as labels: a host's GPUs carry engine.NAME=yes for each engine its agent runs, and a deployment's engine
is a selector on them, so placement, refusals ("excluded by label engine.vllm=yes") and the dry run need nothing
of their own."""

from __future__ import annotations

from collections.abc import Iterable

from agent.engines import AUTO, BUILTIN, ENGINES

ENGINE_CHOICES = (AUTO, *ENGINES)
BUILTIN_ENGINE = BUILTIN.name


def engine_labels(engines: Iterable[str] | None) -> dict[str, str]:
    """engine.NAME=yes for each engine a host runs; a host that says none (an agent from before engines) runs the
    built-in one."""
    return {f"engine.{name}": "yes" for name in (engines or (BUILTIN_ENGINE,))}


def engine_selector(engine: str) -> dict[str, str]:
    """What a deployment's engine requires of a GPU's labels: "auto" runs anywhere (the built-in engine where no
    other runs)."""
    return {} if engine == AUTO else {f"engine.{engine}": "yes"}
