"""Engines as labels: a host's GPUs carry engine.NAME=yes for each engine its agent runs, and a deployment's engine
is a selector on them, so placement, refusals ("excluded by label engine.vllm=yes") and the dry run need nothing
of their own."""

from __future__ import annotations

from collections.abc import Iterable

ENGINE_CHOICES = ("auto", "torch", "vllm")


def engine_labels(engines: Iterable[str] | None) -> dict[str, str]:
    """engine.NAME=yes for each engine a host runs; a host that says none (an agent from before engines) runs torch."""
    return {f"engine.{name}": "yes" for name in (engines or ("torch",))}


def engine_selector(engine: str) -> dict[str, str]:
    """What a deployment's engine requires of a GPU's labels: "auto" runs anywhere (torch where vLLM is not)."""
    return {} if engine == "auto" else {f"engine.{engine}": "yes"}
