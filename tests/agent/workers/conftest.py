"""Fixtures shared by the worker tests."""

import pytest


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny demo Llama, loaded with transformers (imports torch)."""
    from transformers import AutoModelForCausalLM

    from agent.workers.demo_models import build_tiny_llama

    path = build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
