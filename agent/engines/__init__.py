"""The engines, by name: the one place that lists them. Each is a package under agent/engines/ whose __init__ is
its description (a base.Engine): torch-free, Django-free and free of I/O at import, so the console asks it too.

A new engine is a package here and one line in ENGINES.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from agent.artifacts.files import Roots
from agent.artifacts.model_dir import SAFETENSORS, ModelArtifact, model_path
from agent.engines.base import Engine, Launch, Program
from agent.engines.llamacpp import LlamacppEngine
from agent.engines.torch import TorchEngine
from agent.engines.vllm import VllmEngine
from agent.protocol import BUILTIN_ENGINE
from agent.protocol.engine_args import EngineArgsError, EngineSettings

__all__ = ["AUTO", "AUTO_LABEL", "BUILTIN", "ENGINES", "Engine", "Launch", "Program", "auto_engine", "available",
           "choices", "estimate_model", "for_engine", "format_refusal", "get", "inspect", "parse_settings", "reader",
           "refusal", "refusals", "shape", "sleeps_on"]

ENGINES: dict[str, Engine] = {e.name: e for e in (TorchEngine(), VllmEngine(), LlamacppEngine())}
BUILTIN: Engine = ENGINES[BUILTIN_ENGINE]  # runs a replica sent without an engine; what "auto" falls back to
AUTO = "auto"  # a deployment's choice that lets the console pick per host (auto_engine)
AUTO_LABEL = "auto (vLLM for a causal LM where a host runs it, else torch; llama.cpp for a GGUF file)"
_DEVICES = ("cpu", "cuda")


def get(name: str | None) -> Engine:
    """The engine named `name`; the built-in one for None or "" (a replica sent without one). KeyError otherwise."""
    return ENGINES[name] if name else BUILTIN


def choices() -> list[tuple[str, str]]:
    """A deployment's engine choices, (value, label): auto, then every engine."""
    return [(AUTO, AUTO), *((e.name, e.label) for e in ENGINES.values())]


def parse_settings(engine: str, args: list[str], gpus: int | None = None) -> EngineSettings:
    """A deployment's engine arguments checked against its engine's allowlist; for "auto", and an engine that takes
    none, taken whole by one of the engines that take some (auto may pick it; the engine that starts checks them
    again against its own). EngineArgsError naming the first at fault, as the first such engine reads them."""
    found = ENGINES.get(engine)
    if found is not None and found.allowlist() is not None:
        return found.parse_settings(args, gpus)
    if not args:
        return EngineSettings()
    refused: EngineArgsError | None = None
    for other in ENGINES.values():
        if other.allowlist() is not None:
            try:
                return other.parse_settings(args, gpus)
            except EngineArgsError as e:
                refused = refused or e
    if refused is not None:
        raise refused
    return EngineSettings()


def reader(path: str | Path, roots: Roots = None) -> Engine:
    """The engine that reads the model at `path` (inside `roots` when given): the first that claims it as its own
    format, else the built-in one (a safetensors directory). ArtifactError for a path outside the roots."""
    where = model_path(path, roots, kind="any")
    return next((e for e in ENGINES.values() if e.model_format != SAFETENSORS and e.claims(where)), BUILTIN)


def inspect(path: str | Path, roots: Roots = None) -> ModelArtifact:
    """The model at `path` as the engine that reads its format reads it (Engine.inspect)."""
    return reader(path, roots).inspect(path, roots)


def _of_format(model_format: str) -> Engine:
    """The first engine that reads models of `model_format` (the built-in one for safetensors)."""
    return next((e for e in ENGINES.values() if e.model_format == model_format), BUILTIN)


def shape(artifact: ModelArtifact, roots: Roots = None, tokenizer: bool = True):
    """The ModelShape of an inspected model, as the engines of its format read it (Engine.shape)."""
    return _of_format(artifact.format).shape(artifact, roots, tokenizer)


def estimate_model(source: str | Path | ModelArtifact, **options):
    """The Estimate of the model at `source` (or inspected), by the engine that reads its format, before any
    engine's runtime (for_engine adds that)."""
    engine = _of_format(source.format) if isinstance(source, ModelArtifact) else reader(source, options.get("roots"))
    return engine.estimate_model(source, **options)


def format_refusal(engine: str, model_format: str | None) -> str:
    """Why `engine` cannot run a model stored in `model_format` (None: safetensors); "" when it reads that
    format, or when no engine is so named."""
    found = ENGINES.get(engine)
    model_format = model_format or SAFETENSORS
    if found is None or found.model_format == model_format:
        return ""
    readers = [e.name for e in ENGINES.values() if e.model_format == model_format]
    advice = f": deploy it with engine {' or '.join(readers)}" if readers else ""
    return f"engine {engine} runs {found.model_format} models; this model is a {model_format} file{advice}"


def refusal(engine: str, shape, device) -> str:
    """Why `engine` cannot run a model of `shape` on `device`; "" when it can (or when no engine is so named: its
    start is then the judge)."""
    found = ENGINES.get(engine)
    if found is None:
        return ""
    return format_refusal(engine, shape.format) or found.refusal(shape, device)


def refusals(shape) -> dict[str, dict[str, str]]:
    """Every capability check's refusal for a model of `shape`, by engine and device kind ({"vllm": {"cpu":
    "..."}}), among the engines of its format (the others' are format_refusal's, read live); only those that refuse
    are named, so {} means every engine of its format runs it everywhere."""
    out: dict[str, dict[str, str]] = {}
    for name, engine in ENGINES.items():
        if engine.model_format != shape.format:
            continue
        found = {device: why for device in _DEVICES if (why := engine.refusal(shape, device))}
        if found:
            out[name] = found
    return out


def sleeps_on(engine: str, device) -> bool:
    """Whether a replica of `engine` can sleep on `device` (an engine not known here: as the built-in one)."""
    return ENGINES.get(engine, BUILTIN).sleeps_on(device)


def for_engine(est, engine: str):
    """The artifact estimate `est` for a replica run by `engine` (its runtime's own memory added); `est` itself for
    "auto" and the built-in engine."""
    found = ENGINES.get(engine)
    return found.estimate(est) if found is not None else est


def auto_engine(host_engines, task: str, real_gpus: bool, refused: dict[str, dict[str, str]] | None = None,
                model_format: str | None = None) -> str:
    """The engine "auto" runs on a host that runs `host_engines`, for a model stored in `model_format` (None:
    safetensors): the first of that format that auto picks for the model's `task` there and that does not refuse it
    on CUDA; else the built-in one, or for another format the first engine that reads it."""
    model_format = model_format or SAFETENSORS
    readers = [e for e in ENGINES.values() if e.model_format == model_format]
    for engine in readers:
        if (engine.name in host_engines and engine.picked_by_auto(task, real_gpus)
                and not ((refused or {}).get(engine.name) or {}).get("cuda")):
            return engine.name
    return BUILTIN.name if BUILTIN in readers or not readers else readers[0].name


def available(programs: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """(name, version) of every engine this host runs: `programs` are what the agent was told each engine's program
    is. Blocking, once per engine and program (an engine's program may be asked): call it off the event loop the
    first time."""
    found = []
    for engine in ENGINES.values():
        version = _version(engine.name, programs.get(engine.name))
        if version:
            found.append((engine.name, version[:50]))
    return found


@functools.cache
def _version(name: str, program: str | None) -> str:
    return ENGINES[name].version(program)
