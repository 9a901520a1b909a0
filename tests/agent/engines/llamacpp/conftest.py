"""The tiny GGUF models these tests make themselves, and the llama-server binary they run (make llamacpp builds
it; `make test` names it in MODELGRID_LLAMA_SERVER)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LLAMA_SERVER = os.environ.get("MODELGRID_LLAMA_SERVER", "")
needs_server = pytest.mark.skipif(
    not (LLAMA_SERVER and os.access(LLAMA_SERVER, os.X_OK)),
    reason="no llama-server (make llamacpp, then MODELGRID_LLAMA_SERVER=~/.cache/modelgrid/llama.cpp-*/llama-server)")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """The 64-wide tiny demo Llama as safetensors (imports torch once, to build it)."""
    from agent.workers.demo_models import build_tiny_llama_64

    return build_tiny_llama_64(tmp_path_factory.mktemp("models") / "tiny-llama-64")


@pytest.fixture(scope="session")
def ggufs(tiny_llama, tmp_path_factory) -> dict[str, Path]:
    """The tiny Llama as GGUF in every type the writer makes, by type ("F16", "Q8_0", "Q4_0", "F32")."""
    from agent.engines.llamacpp.convert import QUANT_TYPES, write_gguf

    target = tmp_path_factory.mktemp("gguf")
    return {q: write_gguf(tiny_llama, target / f"tiny-llama-64-{q}.gguf", q) for q in QUANT_TYPES}
