"""The tiny GGUF models these tests make themselves, and the interpreter with xllamacpp that runs llama.cpp's
server for them (the engine's default: this one, which requirements.txt gives xllamacpp)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.engines.llamacpp import LlamacppEngine

LLAMA_PYTHON = LlamacppEngine.program.default or ""
needs_server = pytest.mark.skipif(not LLAMA_PYTHON, reason="no xllamacpp here (make install gives it)")


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
