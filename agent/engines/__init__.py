"""The engines, by name: the one place that lists them. Each is a package under agent/engines/ whose __init__ is
its description (a base.Engine): torch-free, Django-free and free of I/O at import, so the console asks it too.

A new engine is a package here and one line in ENGINES.
"""

from __future__ import annotations

from agent.engines.base import Engine, Launch, Program
from agent.engines.torch import TorchEngine
from agent.engines.vllm import VllmEngine

__all__ = ["AUTO", "BUILTIN", "ENGINES", "Engine", "Launch", "Program", "auto_engine", "available", "choices", "get",
           "refusal", "refusals", "sleeps_on"]

ENGINES: dict[str, Engine] = {e.name: e for e in (TorchEngine(), VllmEngine())}
BUILTIN: Engine = ENGINES["torch"]  # what runs a replica whose engine is left out (and what "auto" falls back to)
AUTO = "auto"  # a deployment's choice that lets the console pick per host (auto_engine)
_DEVICES = ("cpu", "cuda")


def get(name: str | None) -> Engine:
    """The engine named `name`; the built-in one for None or "" (a replica sent without one). KeyError otherwise."""
    return ENGINES[name] if name else BUILTIN


def choices() -> list[tuple[str, str]]:
    """A deployment's engine choices, (value, label): auto, then every engine."""
    return [(AUTO, AUTO), *((e.name, e.label) for e in ENGINES.values())]


def refusal(engine: str, shape, device) -> str:
    """Why `engine` cannot run a model of `shape` on `device`; "" when it can (or when no engine is so named: its
    start is then the judge)."""
    found = ENGINES.get(engine)
    return found.refusal(shape, device) if found is not None else ""


def refusals(shape) -> dict[str, dict[str, str]]:
    """Every refusal for a model of `shape`, by engine and device kind ({"vllm": {"cpu": "..."}}); only those that
    refuse are named, so {} means every engine runs it everywhere."""
    out: dict[str, dict[str, str]] = {}
    for name, engine in ENGINES.items():
        found = {device: why for device in _DEVICES if (why := engine.refusal(shape, device))}
        if found:
            out[name] = found
    return out


def sleeps_on(engine: str, device) -> bool:
    """Whether a replica of `engine` can sleep on `device` (an engine not known here: as the built-in one)."""
    return ENGINES.get(engine, BUILTIN).sleeps_on(device)


def auto_engine(host_engines, task: str, real_gpus: bool, refused: dict[str, dict[str, str]] | None = None) -> str:
    """The engine "auto" runs on a host that runs `host_engines`: the first that auto picks for the model's `task`
    on that host and that does not refuse it on CUDA; else the built-in one."""
    for engine in ENGINES.values():
        if (engine.name in host_engines and engine.picked_by_auto(task, real_gpus)
                and not ((refused or {}).get(engine.name) or {}).get("cuda")):
            return engine.name
    return BUILTIN.name


def available(programs: dict[str, str | None]) -> list[tuple[str, str]]:
    """(name, version) of every engine this host runs: `programs` are what the agent was told each engine's program
    is. Blocking (an engine's program may be asked): call it off the event loop."""
    found = []
    for engine in ENGINES.values():
        version = engine.version(programs.get(engine.name))
        if version:
            found.append((engine.name, version[:50]))
    return found
